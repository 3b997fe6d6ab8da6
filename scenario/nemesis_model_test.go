package scenario

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
)

// The linearizability models must be able to fail: each wrong history
// here is one a broken stock engine would produce, and the checker must
// call it illegal; its right twin must pass.
func TestNemesis_CheckerRejectsWrongHistories(t *testing.T) {
	deduct := func(client int, call, ret int64, buyer, user int, result string) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Call: call, Return: ret,
			Input: tvIn{buyer: buyer, user: user}, Output: tvOut{result: result}}
	}
	read := func(call, ret int64, sold int) porcupine.Operation {
		return porcupine.Operation{ClientId: 9, Call: call, Return: ret, Input: tvIn{read: true}, Output: tvOut{sold: sold}}
	}
	hold := func(call, ret int64, op, result string) porcupine.Operation {
		return porcupine.Operation{Call: call, Return: ret, Input: holdIn{order: "o1", op: op}, Output: holdOut{result: result}}
	}
	never := int64(math.MaxInt64)
	tv := tvModel(2, 3, 4, 1) // 2 units, 3 users, 4 buyers, 1 per user
	for _, tc := range []struct {
		name  string
		model porcupine.Model
		ops   []porcupine.Operation
		ok    bool
	}{
		{"two units, two wins, then sold out", tv, []porcupine.Operation{
			deduct(0, 0, 10, 0, 0, "won"), deduct(1, 20, 30, 1, 1, "won"), deduct(2, 40, 50, 2, 2, "sold_out"),
		}, true},
		{"oversold: a third win of two units", tv, []porcupine.Operation{
			deduct(0, 0, 10, 0, 0, "won"), deduct(1, 20, 30, 1, 1, "won"), deduct(2, 40, 50, 2, 2, "won"),
		}, false},
		{"false sold_out: told before any unit went", tv, []porcupine.Operation{
			deduct(0, 0, 10, 0, 0, "sold_out"), deduct(1, 20, 30, 1, 1, "won"),
		}, false},
		{"flip: a won request id later told sold_out", tv, []porcupine.Operation{
			deduct(0, 0, 10, 0, 0, "won"), deduct(1, 20, 30, 1, 1, "won"), deduct(0, 40, 50, 0, 0, "sold_out"),
		}, false},
		{"a repeat of a win is a win", tv, []porcupine.Operation{
			deduct(0, 0, 10, 0, 0, "won"), deduct(1, 20, 30, 1, 1, "won"), deduct(0, 40, 50, 0, 0, "won"),
		}, true},
		{"per-user limit broken", tv, []porcupine.Operation{
			deduct(0, 0, 10, 0, 0, "won"), deduct(1, 20, 30, 3, 0, "won"),
		}, false},
		{"user_limit before the user bought", tv, []porcupine.Operation{
			deduct(0, 0, 10, 3, 0, "user_limit"), deduct(1, 20, 30, 0, 0, "won"),
		}, false},
		{"an unknown outcome may have won", tv, []porcupine.Operation{
			deduct(0, 0, never, 0, 0, "unknown"), deduct(1, 20, 30, 1, 1, "won"), deduct(2, 40, 50, 2, 2, "sold_out"),
		}, true},
		{"stale read: sold 0 after a win returned", tv, []porcupine.Operation{
			deduct(0, 0, 10, 0, 0, "won"), read(20, 30, 0),
		}, false},
		{"read during a win sees either", tv, []porcupine.Operation{
			deduct(0, 0, 30, 0, 0, "won"), read(10, 20, 0), read(40, 50, 1),
		}, true},
		{"confirm after a cancel succeeded", holdModel(), []porcupine.Operation{
			hold(0, 10, "cancel", "ok"), hold(20, 30, "confirm", "ok"),
		}, false},
		{"cancel of a sold order succeeded", holdModel(), []porcupine.Operation{
			hold(0, 10, "confirm", "ok"), hold(20, 30, "cancel", "ok"),
		}, false},
		{"expired before the hold time", holdModel(), []porcupine.Operation{
			hold(100, never, "expire", "ok"), hold(0, 10, "confirm", "expired"),
		}, false},
		{"expired after the hold time", holdModel(), []porcupine.Operation{
			hold(100, never, "expire", "ok"), hold(150, 160, "confirm", "expired"), hold(170, 180, "cancel", "ok"),
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(tc.model, tc.ops); got != tc.ok {
				t.Fatalf("linearizable = %v, want %v", got, tc.ok)
			}
		})
	}
}
