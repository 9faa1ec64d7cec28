// Windows sockets in Go's poller are overlapped handles, not non-blocking
// descriptors: a raw call on them would block the thread and ignore
// deadlines. Raw is false there, so that nothing takes the raw path and
// connections are read and written through net.Conn (as TLS ones are).

package nbio

import "syscall"

// Raw reports whether sockets can be read and written with the raw calls
// of this package.
const Raw = false

// Read is never called on Windows (Raw is false).
func Read(fd int, b []byte) (int, error) { return 0, syscall.EWINDOWS }

// Write is never called on Windows (Raw is false).
func Write(fd int, b []byte) (int, error) { return 0, syscall.EWINDOWS }
