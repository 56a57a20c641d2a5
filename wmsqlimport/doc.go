// Package wmsqlimport moves an application from watermill-sql's
// PostgreSQL Pub/Sub to pglease: [Run] copies, per topic, the messages
// that a consumer group has not acknowledged yet into pglease's topic of
// the same name, in watermill-sql's order, and gives each consumer group
// the pglease position that delivers exactly those messages. It may be
// run again (it copies only what was published since) and while
// publishers move over. The command `pglease import watermill-sql` runs
// it.
//
//	report, err := wmsqlimport.Run(ctx, pool, sourcePool, wmsqlimport.Config{Topics: []string{"orders"}})
package wmsqlimport
