//go:build !unix

package bench

import "time"

// selfCPU is unknown where there is no getrusage: the client's CPU per
// request then reads 0, as the server's does where there is no /proc.
func selfCPU() time.Duration { return 0 }
