//go:build race

package commands

// raceDetector: the tests run under the race detector, which makes the
// lock path several times slower; capacity tests skip themselves.
const raceDetector = true
