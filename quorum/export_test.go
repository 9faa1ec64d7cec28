package quorum

// JoinWaiting is how many attempts of token on key wait behind the one
// under way (see enterJoin), for tests that must know a waiter queued.
func JoinWaiting(q *Quorum, key, token string) int {
	q.joins.mu.Lock()
	defer q.joins.mu.Unlock()
	t, ok := q.joins.m[joinKey{key, token}]
	if !ok {
		return -1
	}
	return len(t.waiting)
}
