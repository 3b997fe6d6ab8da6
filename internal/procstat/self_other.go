//go:build !unix

package procstat

import "time"

// Self is unknown where there is no getrusage: the client's CPU per
// request then reads 0, as the server's does where there is no /proc.
func Self() time.Duration { return 0 }
