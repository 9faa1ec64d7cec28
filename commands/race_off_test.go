//go:build !race

package commands

// raceDetector: see race_on_test.go.
const raceDetector = false
