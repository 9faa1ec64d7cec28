package zookeeper

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// keyDir is the parent znode of key's lock nodes: "k" and the key in
// unpadded base64url, which is injective for any bytes and never contains
// '/' (the "k" keeps an empty encoding from being an empty name).
func keyDir(root, key string) string {
	return root + "/k" + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// gatesDir is the parent znode of every gate. A gate is an ephemeral node
// made with a write node, in the same transaction, and deleted in the
// transaction that ends the node's write holds (its release, its lease's
// end, a downgraded holder's last write UNLOCK) or with the session: it
// exists exactly while its write node has write holds. Readers queued
// behind a writer watch its gate, whose data never changes, not the
// writer's node, whose data every renewal and reentry changes: a renewal
// so wakes no reader. Gates live outside the key's directory so that the
// key's children stay its lock nodes; the name is not a key directory's
// ("k…").
func gatesDir(root string) string {
	return root + "/gates"
}

// gatePath is the gate of the write node made under dir (a keyDir) with
// prefix (a childPrefix): the key's directory name and the prefix, which
// the node's nonce makes unique, joined by a '.', which neither contains.
func gatePath(root, dir, prefix string) string {
	return gatesDir(root) + "/" + dir[strings.LastIndexByte(dir, '/')+1:] + "." + strings.TrimSuffix(prefix, "-")
}

// gateOf is the gate of the write node at path.
func gateOf(root, path string) string {
	i := strings.LastIndexByte(path, '/')
	name := path[i+1:]
	if c, ok := parseChild(name); ok {
		return gatePath(root, path[:i], childPrefix(c.kind, c.hash, c.nonce))
	}
	return gatePath(root, path[:i], name[:max(len(name)-seqDigits, 0)])
}

// tokenHash is 64 bits of the token's SHA-256 in hex: enough to find a
// token's node among a key's children without a read per child; the token
// itself, in the node's data, settles a collision.
func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:8])
}

// Node kinds, the first byte of a child's name.
const (
	kindWrite = 'w'
	kindRead  = 'r'
)

// seqDigits is how many digits ZooKeeper appends to a sequential node:
// the parent's child-change counter (cversion) as Java's "%010d" writes
// it. That counter is a signed 32-bit number, and every create and delete
// of a child moves it, so on a key whose directory is never empty for
// long (held, or queued for, without a break) it wraps: from 2147483647
// to "-2147483648" (eleven characters), then up through "-000000001" to
// "0000000000" (see orderChildren).
const seqDigits = 10

// child is one lock node's name, parsed: "<kind>-<token hash>-<nonce>-<seq>".
// The nonce finds a node whose create's answer was lost (Curator's
// "protected" mode).
type child struct {
	name  string
	kind  byte
	hash  string
	nonce string
	seq   int32
}

// childPrefix is the name ZooKeeper appends the sequence number to.
func childPrefix(kind byte, hash, nonce string) string {
	return string(kind) + "-" + hash + "-" + nonce + "-"
}

// parseChild parses a lock node's name. The sequence number must be
// exactly as ZooKeeper writes it (formatSeq), a negative one too: it then
// holds a fourth '-'.
func parseChild(name string) (child, bool) {
	parts := strings.SplitN(name, "-", 4)
	if len(parts) != 4 || len(parts[0]) != 1 {
		return child{}, false
	}
	k := parts[0][0]
	if k != kindWrite && k != kindRead {
		return child{}, false
	}
	seq, err := strconv.ParseInt(parts[3], 10, 32)
	if err != nil || formatSeq(int32(seq)) != parts[3] {
		return child{}, false
	}
	return child{name: name, kind: k, hash: parts[1], nonce: parts[2], seq: int32(seq)}, true
}

// formatSeq writes a sequence number as ZooKeeper does (Java's "%010d"):
// zero-padded to ten characters, a minus sign counted among them.
func formatSeq(seq int32) string {
	digits := strconv.FormatInt(int64(seq), 10)
	neg := seq < 0
	if neg {
		digits = digits[1:]
	}
	width := seqDigits
	if neg {
		width--
	}
	if pad := width - len(digits); pad > 0 {
		digits = strings.Repeat("0", pad) + digits
	}
	if neg {
		return "-" + digits
	}
	return digits
}

// errUnordered: a key's lock nodes cannot be put in the order they were
// made (see orderChildren). Nothing is granted on such a key.
var errUnordered = errors.New("zookeeper: a key's lock nodes span 2^31 or more sequence numbers " +
	"(its directory's child counter wrapped while one of them lived), so their order is unknown; " +
	"nothing is granted on the key until they go")

// sortChildren parses names and puts the lock nodes in the order they
// were made (orderChildren); other names are ignored.
func sortChildren(names []string) ([]child, error) {
	out := make([]child, 0, len(names))
	for _, n := range names {
		if c, ok := parseChild(n); ok {
			out = append(out, c)
		}
	}
	return out, orderChildren(out)
}

// orderChildren sorts lock nodes in the order they were made. Their
// sequence numbers, read as unsigned, count up around a circle of 2^32
// (see seqDigits), so the order is the circle's, starting after the
// widest gap between two neighbours: nodes made while the counter wrapped
// keep their order ("-2147483648" comes after "2147483647"). That holds
// as long as the live nodes span less than half the circle, where any two
// of them are ordered alike in any read of the key's children, whichever
// instance reads; a wider span (a node alive through a billion creates
// and deletes beside it) is errUnordered, refused rather than guessed.
func orderChildren(kids []child) error {
	if len(kids) < 2 {
		return nil
	}
	sort.Slice(kids, func(i, j int) bool { return uint32(kids[i].seq) < uint32(kids[j].seq) })
	first := 0
	gap := uint64(uint32(kids[0].seq)) + 1<<32 - uint64(uint32(kids[len(kids)-1].seq))
	for i := 1; i < len(kids); i++ {
		if g := uint64(uint32(kids[i].seq) - uint32(kids[i-1].seq)); g > gap {
			first, gap = i, g
		}
	}
	if gap <= 1<<31 {
		return errUnordered
	}
	if first > 0 {
		rotated := append(append(make([]child, 0, len(kids)), kids[first:]...), kids[:first]...)
		copy(kids, rotated)
	}
	return nil
}

// lockData is what a lock node stores. Hold counts live here, not only in
// the instance that made the node, so that another instance given the same
// token can reenter, renew and release it.
type lockData struct {
	// write and read are the token's holds in each mode. A write node
	// gains read holds by a downgrade, and acts as a reader once its
	// write holds are gone.
	write, read int64
	// ttl is the lease the last grant, reentry or renewal that restarted
	// it asked for (a reentry whose lease would end sooner keeps the one
	// the node has: see raised); the creating instance deletes the node
	// ttl after it saw the last change that restarted the lease.
	ttl time.Duration
	// startMS is when that lease began, in Unix milliseconds on the clock
	// of the instance that restarted it (taken before its request, so no
	// later than the start its validity counts from). A change that does
	// not restart the lease (an UNLOCK of one of several holds) keeps it:
	// the node's mtime then no longer tells when the lease began. 0: not
	// known, data in the previous format (version 1), whose lease runs
	// from the node's last change (mtime).
	startMS int64
	// gated: the node is of format 3, whose write nodes have a gate (see
	// gatesDir) while they have write holds. A node of an earlier format
	// keeps its format, and so has no gate, when changed.
	gated bool
	token string
}

// hasGate reports whether a node with data d has a gate.
func (d lockData) hasGate() bool { return d.gated && d.write > 0 }

// Data format versions. Versions 1 (no lease start) and 2 (no gate) are
// still read: nodes an instance not yet upgraded made or last changed,
// during a rolling upgrade. Version 3 has version 2's layout.
const (
	dataV1      = 1
	dataV2      = 2
	dataVersion = 3
)

// dataHeaderV1: version byte, write, read, ttl in ms. dataHeader adds the
// lease start in Unix ms.
const (
	dataHeaderV1 = 1 + 8 + 8 + 8
	dataHeader   = dataHeaderV1 + 8
)

func (d lockData) encode() []byte {
	b := make([]byte, dataHeader, dataHeader+len(d.token))
	b[0] = dataV2
	if d.gated {
		b[0] = dataVersion
	}
	binary.BigEndian.PutUint64(b[1:], uint64(d.write))
	binary.BigEndian.PutUint64(b[9:], uint64(d.read))
	binary.BigEndian.PutUint64(b[17:], uint64(d.ttl.Milliseconds()))
	binary.BigEndian.PutUint64(b[25:], uint64(d.startMS))
	return append(b, d.token...)
}

var errBadData = errors.New("zookeeper: lock node data is not lockproxy's")

func decodeData(b []byte) (lockData, error) {
	header := dataHeader
	switch {
	case len(b) >= dataHeaderV1 && b[0] == dataV1:
		header = dataHeaderV1
	case len(b) >= dataHeader && (b[0] == dataV2 || b[0] == dataVersion):
	default:
		return lockData{}, errBadData
	}
	write, read := int64(binary.BigEndian.Uint64(b[1:])), int64(binary.BigEndian.Uint64(b[9:]))
	ttlMS := binary.BigEndian.Uint64(b[17:])
	if write < 0 || read < 0 || ttlMS > uint64(math.MaxInt64/int64(time.Millisecond)) {
		return lockData{}, errBadData
	}
	var startMS int64
	if header == dataHeader {
		if startMS = int64(binary.BigEndian.Uint64(b[25:])); startMS < 0 {
			return lockData{}, errBadData
		}
	}
	return lockData{
		write:   write,
		read:    read,
		ttl:     time.Duration(ttlMS) * time.Millisecond,
		startMS: startMS,
		gated:   b[0] == dataVersion,
		token:   string(b[header:]),
	}, nil
}

// leaseStart is when the lease of a node with data d and stat st began:
// as recorded, or for data in the previous format its last change.
func (d lockData) leaseStart(st *zk.Stat) time.Time {
	if d.startMS > 0 {
		return time.UnixMilli(d.startMS)
	}
	return time.UnixMilli(st.Mtime)
}

// raised is d with its lease made to end no sooner than it did nor than
// ttl after t0 (st is the node's stat with d): the lease it had when that
// ends later, otherwise one of ttl from t0. A reentry so never moves a
// lease's end earlier, even when its t0 is before the lease began (the
// grant of another LOCK with the token, made while this one was on its
// way), and when the new end is the later it stores exactly its own lease,
// which LOCKINFO then shows as the validity it gave. The ends are compared
// as stored, on the clocks of the instances that started them; the
// creating instance's timer, on its own clock, never moves earlier either
// (see written).
func (d lockData) raised(st *zk.Stat, t0 time.Time, ttl time.Duration) lockData {
	start := d.leaseStart(st).UnixMilli()
	if d.startMS == 0 {
		// A previous-format lease, running from the last change, which
		// the write to come moves: record its start.
		d.startMS = start
	}
	if t0.UnixMilli()+ttl.Milliseconds() >= start+d.ttl.Milliseconds() {
		d.startMS, d.ttl = t0.UnixMilli(), ttl
	}
	return d
}
