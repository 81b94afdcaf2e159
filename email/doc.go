// Package email sends mail through an SMTP server (go-mail) under an
// idempotency key, so that a message redelivered by a queue is sent once
// in the common cases and the rare duplicate is bounded, named and
// recognisable.
//
// SMTP has no idempotency key: a server that accepted a message will accept
// it again. So a [Sender] keeps a sent-record per key in an
// [effects.Journal] (package effectively.dev/postgres provides one) and
// gives every message a Message-ID derived from the key ([MessageID]):
//
//   - Begin claims the key with a lease. A key already done is answered from
//     the record ([effects.Replayed], with the server's reply as Ref)
//     without talking to the server; a key another attempt holds is
//     [effects.ErrInFlight] (retry later); a key used with another message
//     is [effects.ErrKeyReused].
//   - The message is sent. When the server answered 250 to the end of DATA
//     the record is completed with the server's reply ("2.0.0 OK: queued as
//     ...") as Ref, even if the connection failed afterwards (go-mail's
//     Msg.IsDelivered).
//   - A definite failure before the server accepted the data (a refused
//     connection, a 4xx or 5xx to MAIL, RCPT, DATA or the end of data)
//     releases the lease so the next attempt need not wait, and returns
//     [effects.ErrTransient] (4xx, network) or an error matching
//     [ErrRejected] (5xx, permanent).
//   - A failure after the message was handed over and before the 250 was
//     read (the connection cut after DATA, a timeout, a cancelled context)
//     is an unknown outcome: the server may have the message. Apply returns
//     [effects.ErrAmbiguous] and leaves the record pending. The lease then
//     decides: a retry within the lease gets ErrInFlight; a retry after it
//     sends the message again, with the same Message-ID.
//
// That last case is why the contract is [effects.AtLeastOnce]: a duplicate
// appears only when an attempt ended without learning its outcome — the
// SMTP server's 250 was lost, or the process died after the 250 and before
// the sent-record committed — and the key was retried after the lease
// expired. The duplicate carries the same Message-ID; receivers may collapse
// it (some mail stores and list software do), most will not. Clean
// redeliveries and concurrent duplicates never send twice.
//
// The lease is a bet on how long one attempt can take. Apply abandons the
// SMTP session when the lease runs out, so an attempt that started after the
// lease expired never overlaps a slow one still talking to the server;
// choose a lease well above a normal send (the default is a minute) and
// retry ErrInFlight for longer than the lease.
//
// When not to use it: for a message whose duplicate does harm ("you have
// been charged", "your code is 123456", anything a reader acts on twice),
// because no SMTP sender can rule a duplicate out. Make such a message
// harmless to repeat, or send it from an effect that is itself effectively
// once (a row written in the same transaction as the charge, read by a
// relay that a human can audit). Use this package for receipts,
// notifications and digests, where one extra copy is an annoyance.
//
// The server must be reached with STARTTLS or in plain text: the Sender
// dials for go-mail (to watch the context and inject faults in tests), so
// go-mail's implicit TLS (mail.WithSSL, port 465) is not supported.
package email
