package commands

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/lockproxy/lockproxy/resp"
)

// lockinfo: LOCKINFO key [TOKEN token]
//
// Tokens are capabilities (whoever knows one can UNLOCK), so the reply
// shows a holder's token in full only to a caller that names it with
// TOKEN; everyone else sees "sha256:" and the first 8 bytes of its hash,
// enough to tell holders apart and to match a token one has.
func (h *Handler) lockinfo(s *resp.Session, args [][]byte) {
	if err := h.limits.checkKey(args[1]); err != nil {
		s.W.Error(err.Error())
		return
	}
	var own []byte
	switch {
	case len(args) == 2:
	case len(args) == 4 && resp.EqualFold(args[2], "TOKEN"):
		own = args[3]
	default:
		s.W.Error(errSyntax.Error())
		return
	}
	info, ok, err := h.backend.Info(s.Context(), string(args[1]))
	if err != nil {
		h.replyError(s, "lockinfo", err)
		return
	}
	if !ok {
		s.W.Null()
		return
	}
	w := s.W
	w.Map(5)
	w.BulkString("mode")
	w.BulkString(info.Mode.String())
	w.BulkString("holders")
	w.Array(len(info.Holders))
	for _, hd := range info.Holders {
		w.Map(3)
		w.BulkString("token")
		if own != nil && string(own) == hd.Token {
			w.BulkString(hd.Token)
		} else {
			w.BulkString(shortToken(hd.Token))
		}
		w.BulkString("holds")
		w.Int(hd.Holds)
		w.BulkString("ttl_ms")
		w.Int(hd.TTL.Milliseconds())
	}
	w.BulkString("ttl_ms")
	w.Int(info.TTL.Milliseconds())
	w.BulkString("fence")
	w.Uint(info.Fence)
	w.BulkString("waiters")
	w.Int(int64(info.Waiters))
}

// shortToken is how LOCKINFO shows a token to someone who did not name it.
func shortToken(t string) string {
	sum := sha256.Sum256([]byte(t))
	return "sha256:" + hex.EncodeToString(sum[:8])
}
