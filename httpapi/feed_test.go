package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"

	"stockd.dev/stockd/stock"
)

// eventsJSONReference builds GET /v1/events's answer the slow, obvious way;
// the hand encoder must produce the same JSON.
func eventsJSONReference(after stock.Cursor, page *stock.FeedPage) eventsResponse {
	out := eventsResponse{Events: make([]eventJSON, len(page.Events)), Next: after.String(), Head: page.Head.String(), NodeBehind: page.Behind}
	for i := range page.Events {
		e := &page.Events[i]
		o := &e.Order
		out.Events[i] = eventJSON{Cursor: e.Cursor().String(), Type: e.Type.String(), OrderID: o.ID, SKU: o.SKU, User: o.User,
			Qty: o.Qty, State: string(o.State), RequestID: o.RequestID, Reason: o.ReleaseReason, Node: o.Node,
			At: stamp(e.At), ExpiresAt: stamp(o.ExpiresAtUnixNano)}
		out.Next = out.Events[i].Cursor
	}
	return out
}

func TestAppendEvents_MatchesTheReferenceEncoding(t *testing.T) {
	pages := []stock.FeedPage{
		{},
		{Behind: true, Head: stock.Cursor{Index: 9, Seq: 4}},
		{Head: stock.Cursor{Index: 12, Seq: 7}, Events: []stock.FeedEvent{
			{Seq: 6, Index: 11, Type: stock.FeedOrderCreated, At: 1_700_000_000_123_456_789, Order: stock.Order{
				ID: "n1-5-abc", SKU: "phone", User: `al"ice\` + "\u00e9\u2028", Qty: 2, State: stock.OrderHeld, RequestID: "r-1",
				Node: "n1", ExpiresAtUnixNano: 1_700_000_090_000_000_000}},
			{Seq: 7, Index: 12, Type: stock.FeedOrderReleased, At: 1, Order: stock.Order{
				ID: "n2-1-x", SKU: "phone", User: "bob", Qty: 1, State: stock.OrderReleased, ReleaseReason: stock.ReleaseTurnedDownUserLimit}},
		}},
	}
	for i := range pages {
		after := stock.Cursor{Index: 3, Seq: 2}
		var got, want eventsResponse
		b := appendEvents(nil, after, &pages[i])
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("page %d: %s does not decode: %v", i, b, err)
		}
		ref, _ := json.Marshal(eventsJSONReference(after, &pages[i]))
		if err := json.Unmarshal(ref, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("page %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
}
