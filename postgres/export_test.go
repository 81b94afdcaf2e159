package postgres

// HoldJournal makes j's Begins and Completes queue as if every statement
// slot of their kind were taken. queued reports how many calls wait; release
// runs each kind's queue as one statement (two, if a key is queued twice).
func HoldJournal(j *Journal) (queued func() int, release func()) {
	j.begins.mu.Lock()
	j.begins.inFlight = j.begins.limit
	j.begins.mu.Unlock()
	j.completes.mu.Lock()
	j.completes.inFlight = j.completes.limit
	j.completes.mu.Unlock()
	queued = func() int {
		j.begins.mu.Lock()
		defer j.begins.mu.Unlock()
		j.completes.mu.Lock()
		defer j.completes.mu.Unlock()
		return len(j.begins.queue) + len(j.completes.queue)
	}
	release = func() {
		j.begins.releaseHeld()
		j.completes.releaseHeld()
	}
	return queued, release
}

// JournalStatements reports how many statements j's Begins and Completes
// ran (a coalesced statement counts once).
func JournalStatements(j *Journal) (begins, completes int64) {
	return j.begins.statements.Load(), j.completes.statements.Load()
}

// SetJournalStatements sets how many statements of one kind j runs at
// once before calls share them (1<<30: never share).
func SetJournalStatements(j *Journal, n int) {
	j.begins.limit = n
	j.completes.limit = n
}

// releaseHeld ends what HoldJournal started: as if the one statement in
// flight returned, with the queue, if any, as the next.
func (c *coalescer[Req, Res]) releaseHeld() {
	c.mu.Lock()
	c.inFlight = 1
	c.mu.Unlock()
	if b := c.take(); b != nil {
		go c.flush(b)
	}
}

// HoldGroup makes e's grouped Applies queue as if every transaction slot
// were taken (e must have the grouped shape). queued reports how many
// Applies wait; release runs them, as a finished transaction would: the
// queue as the next group (distinct keys; a key queued twice waits for the
// group after). Holds may overlap: each release gives back its own slots.
func HoldGroup[In any](e *Effect[In]) (queued func() int, release func()) {
	c := e.group
	n := max(c.limit, 1)
	c.mu.Lock()
	c.inFlight += n
	c.mu.Unlock()
	queued = func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queue)
	}
	release = func() {
		for range n {
			if b := c.take(); b != nil {
				go c.flush(b)
			}
		}
	}
	return queued, release
}

// Groups reports how many transactions (or lone attempts) e's grouped
// Applies ran, and whether e has the grouped shape.
func Groups[In any](e *Effect[In]) (int64, bool) {
	if e.group == nil {
		return 0, false
	}
	return e.group.statements.Load(), true
}

// GuardedInsertKeySQL is the key's INSERT that Apply sends with COMMIT.
const GuardedInsertKeySQL = guardedInsertKeySQL
