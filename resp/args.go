package resp

// Argument helpers that do not allocate: commands are parsed on every
// request, and the arguments are byte slices into the read buffer.

// EqualFold reports whether arg equals the ASCII word w, ignoring case. w
// must be upper case.
func EqualFold(arg []byte, w string) bool {
	if len(arg) != len(w) {
		return false
	}
	for i := 0; i < len(arg); i++ {
		c := arg[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != w[i] {
			return false
		}
	}
	return true
}

// ParseInt parses a decimal int64 the way Redis's string2ll does: an
// optional minus sign, digits, no spaces, no plus sign, no leading zeros
// (except "0" itself), no overflow.
func ParseInt(arg []byte) (int64, bool) {
	if len(arg) == 0 || len(arg) > 20 {
		return 0, false
	}
	neg := false
	i := 0
	if arg[0] == '-' {
		neg = true
		i = 1
		if len(arg) == 1 {
			return 0, false
		}
	}
	if arg[i] == '0' && (len(arg) > i+1 || neg) {
		return 0, false // leading zeros and "-0", as Redis's string2ll
	}
	var v uint64
	for ; i < len(arg); i++ {
		c := arg[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	if neg {
		if v > 1<<63 {
			return 0, false
		}
		return -int64(v), true
	}
	if v > 1<<63-1 {
		return 0, false
	}
	return int64(v), true
}

// Lower writes the ASCII lower-case form of name into buf and returns it;
// names longer than buf are returned unchanged (no command is that long,
// so they miss the table, as they should).
func Lower(buf []byte, name []byte) []byte {
	if len(name) > len(buf) {
		return name
	}
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	return buf[:len(name)]
}
