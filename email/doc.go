// Package email sends mail through an SMTP server (go-mail) under an
// idempotency key, so that a message redelivered by a queue is sent once
// in the common cases and the rare duplicate is bounded, named and
// recognisable.
//
// SMTP has no idempotency key: a server that accepted a message will accept
// it again. So a [Sender] keeps a sent-record per key in an
// [journal.Journal] (package effectively.dev/postgres provides one) and
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
//     [effects.ErrTransient] (4xx, network) or [effects.ErrRefused]
//     wrapping an error that matches [ErrRejected] (5xx, permanent: a
//     consumer dead-letters it at once), unless the 5xx says the login
//     is wrong or missing, which is a configuration error.
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
// The protocol and its policy are [journal.Journaled]'s, the same as
// Stripe's journal and the Kafka producer's: a journal failure before the
// send is [effects.ErrTransient] (nothing was sent); the sent-record is
// completed on a context detached from the caller's and retried while the
// failure is retryable, for up to the journal's record timeout
// ([journal.WithRecordTimeout], 10 s by default); if it
// still does not commit, Apply returns Applied and logs it. Changed on
// purpose with the move to journal.Journaled: a journal error of Begin that
// the journal did not classify was returned as it was (so
// [effects.ClassOf] did not call it retryable) and is now ErrTransient, and so is an
// ambiguous Begin (the journal's reply was lost, but no message was sent);
// Complete was tried three times and is now retried until the record
// timeout.
//
// The lease is a bet on how long one attempt can take. Apply abandons the
// SMTP session at nine tenths of the lease, so an attempt that started after the
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
// # Messages
//
// A [Message] has the usual fields (From, To, Cc, Bcc, Reply-To, Subject),
// a text body with an optional HTML alternative, extra header fields
// ([Header]: List-Unsubscribe, a campaign tag) and attachments
// ([Attachment], attached or inline for the HTML to show). Every field is
// part of the fingerprint, so a key reused with any change is
// [effects.ErrKeyReused]; a message is checked before any I/O
// ([ErrInvalidMessage]: no sender or recipient, an address or header that
// does not parse, a header the Sender writes itself).
//
// # TLS and connecting
//
// go-mail requires STARTTLS by default (mail.TLSMandatory): a server that
// does not offer it is refused, and so is a certificate the client does not
// trust. Choose the policy with [WithMailOptions]:
// mail.WithTLSPolicy(mail.TLSOpportunistic) uses STARTTLS when offered,
// mail.WithTLSPolicy(mail.NoTLS) never (a local relay, a test server), and
// mail.WithTLSConfig sets the trusted CAs. A refusal that no retry fixes
// (the certificate, STARTTLS required but not offered, a host name that
// does not exist) is a configuration error, errors.Is
// [effects.ErrInvalidConfig] with an *[effects.ConfigError] naming the
// server, and is not retryable; so is a refused login (535, and the other
// authentication replies), whose ConfigError names the SMTP AUTH options.
// A refused connection or a timeout stays [effects.ErrTransient], since a
// restarting server looks the same. [Sender.Check] opens a session (EHLO,
// STARTTLS, AUTH) without sending, for a worker to run at start-up.
//
// Error texts carry no mail addresses: go-mail and servers quote the
// recipients, so [SMTPError.Error] replaces them by "<address>" before a
// consumer logs them; the go-mail error underneath keeps them.
//
// The server must be reached with STARTTLS or in plain text: the Sender
// dials for go-mail (to watch the context and inject faults in tests), so
// go-mail's implicit TLS (mail.WithSSL, port 465) is not supported.
//
// # Sessions
//
// A Sender keeps up to 8 SMTP sessions open between messages
// ([WithIdleSessions]), so a message skips the connect, the
// greeting, EHLO, STARTTLS and AUTH of a new session (about 0.7 of the
// time per message over loopback, see BenchmarkSend; more over a real
// network with TLS). A session idle longer than 30 s is closed, not used. One the server dropped while it was idle fails before
// anything is handed over, and the message goes out on a new session at
// once: no error, no duplicate. So the Sender skips go-mail's NOOP
// before each message and its RSET after one (RFC 5321 ends a mail
// transaction with the reply to DATA): a message on an open session is
// MAIL, RCPT and DATA, three round trips fewer than go-mail's default.
// [Sender.Close] ends the idle sessions.
package email
