# Many small CPython objects (a dict of lists of strings): with PYTHONMALLOC=malloc and
# --min-alloc 0 every one of them is in remote memory. Arg: number of keys.
import sys
n = int(sys.argv[1])
d = {}
for i in range(n):
    d["key-%d" % i] = ["v%d" % i, i * 3, str(i * 7)]
s = 0
for i in range(0, n, 7):
    s += d["key-%d" % i][1]
print("small ok", len(d), s)
