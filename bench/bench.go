package bench

import "io"

// Main runs the bench command.
func Main(args []string, stdout, stderr io.Writer) error { return nil }
