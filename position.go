package pglease

// Position is a place in the delivery order of a topic: messages are
// delivered ordered by (TransactionID, Offset), where TransactionID is the
// xid8 of the transaction that inserted the message. The zero Position is
// the beginning of every topic.
type Position struct {
	TransactionID uint64 `json:"transaction_id"`
	Offset        int64  `json:"offset"`
}
