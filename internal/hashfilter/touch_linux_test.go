package hashfilter

import (
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// TestNew_WritesEveryPage checks, with mincore, that a new filter's pages
// are in memory before its first question: pages never written would be
// read from the kernel's zero page, which costs a node's sold-out answers
// dearly on the machines we measure (see touch).
func TestNew_WritesEveryPage(t *testing.T) {
	f := New(24) // 2 MiB, a fresh allocation from the kernel in a test binary
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(&f.bits[0]))
	end := start + uintptr(len(f.bits))*8
	first := (start + page - 1) &^ (page - 1) // whole pages inside the bits
	last := end &^ (page - 1)
	vec := make([]byte, (last-first)/page)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, first, last-first, uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Skipf("mincore: %v", errno)
	}
	missing := 0
	for _, v := range vec {
		if v&1 == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of the filter's %d pages are not in memory after New", missing, len(vec))
	}
}
