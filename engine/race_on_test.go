//go:build race

package engine

// raceEnabled: allocation counts mean nothing under the race detector.
const raceEnabled = true
