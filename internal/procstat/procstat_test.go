package procstat

import (
	"crypto/sha256"
	"os"
	"testing"
)

// TestCPU_ReadsAProcessesTime: the server side of the CPU per
// request comes from /proc/<pid>/stat; after work of its own this process
// has used CPU by that account, and a process that does not exist is
// reported as unreadable rather than as zero CPU.
func TestCPU_ReadsAProcessesTime(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here: server CPU is not measured on this system")
	}
	sum := sha256.Sum256(nil)
	for range 200_000 { // tens of milliseconds of CPU: several clock ticks
		sum = sha256.Sum256(sum[:])
	}
	d, ok := CPU([]int{os.Getpid()})
	if !ok || d <= 0 {
		t.Fatalf("this process's CPU: %s ok=%v (after hashing to %x)", d, ok, sum[:4])
	}
	if _, ok := CPU([]int{os.Getpid(), 1 << 30}); ok {
		t.Fatal("a pid that does not exist read as ok")
	}
}
