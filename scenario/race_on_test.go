//go:build race

package scenario

// raceEnabled: allocation counts mean nothing under the race detector.
const raceEnabled = true
