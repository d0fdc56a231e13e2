# bash forks for every command substitution, subshell, pipeline stage and background job;
# under `rmem run --min-alloc 0` each child reads bash's remote memory (variables, arrays,
# functions) as it was at its fork. The output must equal a plain run's.
set -e
greet() { echo "hello $1"; }
x=$(echo hi)
echo "x=$x"
declare -a arr
for i in $(seq 1 300); do arr[i]="value-$i-$(printf '%05d' "$i")"; done
sum=0
for i in $(seq 1 300); do
  v=$(echo "${arr[i]}")
  [ "$v" = "value-$i-$(printf '%05d' "$i")" ] || { echo "bad substitution at $i: $v"; exit 1; }
  sum=$((sum + ${#v}))
done
echo "sum=$sum"
big=$(for i in $(seq 1 2000); do printf '%s,' "$i"; done)
echo "big=${#big} ${big:0:20}"
( inner=sub; arr[5]=changed-in-subshell; echo "subshell sees ${arr[7]} $inner" )
echo "parent keeps ${arr[5]}"
nested=$( (echo "level1 $(echo "level2 $(greet level3)")") | tr 'a-z' 'A-Z')
echo "nested=$nested"
count=$(printf '%s\n' "${arr[@]}" | grep -c value)
echo "count=$count"
while read -r a b; do echo "read $a $b"; done < <(printf '%s %s\n' one two three four)
{ sleep 0.1; echo "background ${arr[300]}"; } &
wait
words=$(greet "$(greet world)")
echo "words=$words"
echo done
