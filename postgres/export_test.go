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
