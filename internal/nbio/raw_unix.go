//go:build !windows

package nbio

// Raw reports whether sockets can be read and written with the raw calls
// of this package: on unix they are non-blocking descriptors.
const Raw = true
