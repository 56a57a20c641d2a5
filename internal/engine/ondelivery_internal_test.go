package engine

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TestSettlement: the settled func of OnDelivery gets what the handler did
// with the message, however the delivery ended, and why it ended when the
// handler did neither.
func TestSettlement(t *testing.T) {
	for _, tc := range []struct {
		name      string
		settle    func(*message.Message) bool
		res       outcome
		want      error // errors.Is
		wantLost  bool
		wantExact error
	}{
		{name: "acked", settle: (*message.Message).Ack, res: proceed, wantExact: nil},
		{name: "acked, then the subscription ended", settle: (*message.Message).Ack, res: stopped, wantExact: nil},
		{name: "acked, then ownership lost", settle: (*message.Message).Ack, res: lost, wantExact: nil},
		{name: "nacked", settle: (*message.Message).Nack, res: proceed, wantExact: ErrNacked},
		{name: "nacked, then the subscription ended", settle: (*message.Message).Nack, res: stopped, wantExact: ErrNacked},
		{name: "subscription ended", res: stopped, want: ErrDeliveryEnded, wantExact: errDeliveryStopped},
		{name: "ownership lost", res: lost, want: ErrDeliveryEnded, wantLost: true, wantExact: errDeliveryLost},
		{name: "handed over", res: yielded, want: ErrDeliveryEnded, wantExact: errDeliveryYielded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := message.NewMessage("id", nil)
			if tc.settle != nil {
				tc.settle(msg)
			}
			err := settlement(msg, tc.res)
			if err != tc.wantExact { //nolint:errorlint // the very value
				t.Fatalf("settlement = %v, want %v", err, tc.wantExact)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("settlement = %v, not %v", err, tc.want)
			}
			if errors.Is(err, ErrOwnershipLost) != tc.wantLost {
				t.Errorf("settlement = %v: errors.Is(ErrOwnershipLost) = %v, want %v", err, !tc.wantLost, tc.wantLost)
			}
		})
	}
}
