// A Go program with a heap several times rmem's budget: goroutines fill and sort slices of
// numbers, build maps of strings, and drop them for the garbage collector, round after round.
// Prints a checksum of the results, then its peak resident set (VmHWM) on stderr. Run by
// crates/rmem-cli/tests/transparent.rs (go_programs_built_with_cgo_are_paged_with_anon_mmap).
package main

// The C library is linked (cgo), as it is for Go programs that resolve names or use C
// libraries: only then can rmem's library be loaded into it.

// #include <stdlib.h>
import "C"

import (
	"crypto/sha256"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
)

func work(id, mib int) [32]byte {
	h := sha256.New()
	seed := uint64(id)*2654435761 + 1
	next := func() uint64 {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return seed
	}
	for round := 0; round < 3; round++ {
		a := make([]uint64, mib<<20/8)
		for i := range a {
			a[i] = next()
		}
		sort.Slice(a, func(i, j int) bool { return a[i] < a[j] })
		m := make(map[string]int)
		for i := 0; i < 20000; i++ {
			m["k"+strconv.FormatUint(a[int(next()%uint64(len(a)))]%100000, 10)] += i
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(h, "%d %d %d %s", a[0], a[len(a)/2], a[len(a)-1], strings.Join(keys[:10], ","))
		for _, k := range keys {
			fmt.Fprint(h, m[k])
		}
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

func main() {
	mib, _ := strconv.Atoi(os.Args[1])
	const workers = 4
	sums := make([][32]byte, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			sums[w] = work(w, mib)
		}(w)
	}
	wg.Wait()
	for _, s := range sums {
		fmt.Printf("%x\n", s)
	}
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			fmt.Fprintln(os.Stderr, l)
		}
	}
}
