//go:build !unix

package sdnotify

// Reloading is the message for the start of a reload. There is no systemd
// (nor SIGHUP) off unix, so nothing sends it; it has no monotonic time.
func Reloading() string { return "RELOADING=1" }

// supported is false: there is no systemd here, and Notify does nothing
// even with $NOTIFY_SOCKET set.
const supported = false
