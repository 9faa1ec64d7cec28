//go:build linux

package nbio

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// socketPair is a connected pair of non-blocking stream sockets, closed at
// the end of the test.
func socketPair(t *testing.T) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	t.Cleanup(func() {
		unix.Close(fds[0])
		unix.Close(fds[1])
	})
	return fds[0], fds[1]
}

func TestReadWrite(t *testing.T) {
	a, b := socketPair(t)
	buf := make([]byte, 16)

	// Nothing sent yet: the read must not wait, and says so as EAGAIN.
	if n, err := Read(b, buf); err != unix.EAGAIN {
		t.Fatalf("read of an empty socket = %d, %v; want EAGAIN", n, err)
	}
	if n, err := Write(a, []byte("PING\r\n")); n != 6 || err != nil {
		t.Fatalf("write = %d, %v; want 6, nil", n, err)
	}
	n, err := Read(b, buf)
	if err != nil || !bytes.Equal(buf[:n], []byte("PING\r\n")) {
		t.Fatalf("read = %q, %v; want PING", buf[:n], err)
	}
	// Empty buffers are valid calls, not a nil-pointer dereference.
	if n, err := Write(a, nil); n != 0 || err != nil {
		t.Fatalf("empty write = %d, %v", n, err)
	}
	// The peer's close reads as 0 bytes, no error, as read(2) says.
	unix.Close(a)
	if n, err := Read(b, buf); n != 0 || err != nil {
		t.Fatalf("read after close = %d, %v; want 0, nil", n, err)
	}
}

func TestWriteFullSocket(t *testing.T) {
	a, _ := socketPair(t)
	chunk := make([]byte, 64<<10)
	// A peer that never reads fills the socket; the write then reports
	// EAGAIN instead of waiting. Bounded: a socket buffer is far below 64 MB.
	for i := 0; i < 1024; i++ {
		n, err := Write(a, chunk)
		if err == unix.EAGAIN {
			return
		}
		if err != nil || n <= 0 {
			t.Fatalf("write %d = %d, %v", i, n, err)
		}
	}
	t.Fatal("64 MB written to a socket nobody reads, never EAGAIN")
}

func TestBadDescriptor(t *testing.T) {
	buf := make([]byte, 4)
	if _, err := Read(-1, buf); err != unix.EBADF {
		t.Errorf("read(-1) = %v; want EBADF", err)
	}
	if _, err := Write(-1, buf); err != unix.EBADF {
		t.Errorf("write(-1) = %v; want EBADF", err)
	}
	if _, err := EpollPoll(-1, make([]unix.EpollEvent, 1)); err != unix.EBADF {
		t.Errorf("epoll_pwait(-1) = %v; want EBADF", err)
	}
}

func TestEpollPoll(t *testing.T) {
	a, b := socketPair(t)
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatalf("epoll_create1: %v", err)
	}
	defer unix.Close(epfd)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, b, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(b)}); err != nil {
		t.Fatalf("epoll_ctl: %v", err)
	}
	events := make([]unix.EpollEvent, 4)
	if n, err := EpollPoll(epfd, events); n != 0 || err != nil {
		t.Fatalf("poll with nothing ready = %d, %v; want 0, nil", n, err)
	}
	if _, err := Write(a, []byte("x")); err != nil {
		t.Fatal(err)
	}
	n, err := EpollPoll(epfd, events)
	if n != 1 || err != nil || events[0].Fd != int32(b) || events[0].Events&unix.EPOLLIN == 0 {
		t.Fatalf("poll with b readable = %d, %v, %+v", n, err, events[0])
	}
	if n, err := EpollPoll(epfd, nil); err != unix.EINVAL {
		t.Fatalf("poll into no events = %d, %v; want EINVAL", n, err)
	}
}
