//go:build race

package main

// raceEnabled: allocation counts mean nothing under the race detector.
const raceEnabled = true
