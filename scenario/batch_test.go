package scenario

import (
	"encoding/json"
	"fmt"
	"stockd.dev/stockd/node/nodetest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// batchItemResult is one result of POST /v1/deducts.
type batchItemResult struct {
	Status  int    `json:"status"`
	Error   string `json:"error"`
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
}

func postBatch(t *testing.T, c *fasthttp.HostClient, body string) (int, []batchItemResult, string) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(c, "/v1/deducts"))
	req.Header.SetMethod("POST")
	req.SetBodyString(body)
	if err := c.DoTimeout(req, resp, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	contractLog.record(req, resp)
	var out struct {
		Results []batchItemResult `json:"results"`
	}
	if resp.StatusCode() == 200 {
		if err := json.Unmarshal(resp.Body(), &out); err != nil {
			t.Fatalf("batch answer %s: %v", resp.Body(), err)
		}
	}
	return resp.StatusCode(), out.Results, string(resp.Body())
}

// batchItems is 1,000 deducts over the ten SKUs prefix0..prefix9, with a
// few malformed items and one for a sale that does not exist.
func batchItems(prefix string) []string {
	items := make([]string, 1000)
	for i := range items {
		items[i] = fmt.Sprintf(`{"sku":"%s%d","user":"u%d","request_id":"%s-r%d"}`, prefix, i%10, i, prefix, i)
	}
	items[17] = fmt.Sprintf(`{"sku":"%s7","user":"u17","qty":0}`, prefix)     // bad qty
	items[33] = `{"sku":"not a sku!","user":"u33"}`                           // bad sku
	items[50] = fmt.Sprintf(`{"sku":"%s0","request_id":"x"}`, prefix)         // no user
	items[77] = fmt.Sprintf(`{"sku":"%s-none","user":"u77"}`, prefix)         // no such sale
	items[91] = fmt.Sprintf(`{"sku":"%s1","user":"u91","qty":"two"}`, prefix) // qty of another type
	return items
}

func TestBatch_EachItemAnsweredAsTheSingleDeductWouldBe(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	cl := nodetest.ClientOf(n, 16)
	// Ten sales each for the batch and for single deducts: five of 100
	// units (enough for their 100 buyers), five of 10 (sold out).
	for _, prefix := range []string{"b", "s"} {
		for k := range 10 {
			total := 100
			if k >= 5 {
				total = 10
			}
			if code, body := nodetest.Call(t, cl, "PUT", fmt.Sprintf("/v1/skus/%s%d", prefix, k), fmt.Sprintf(`{"total":%d}`, total)); code != 201 {
				t.Fatalf("create sale: %d %v", code, body)
			}
		}
	}
	items := batchItems("b")
	code, results, body := postBatch(t, cl, `{"deducts":[`+strings.Join(items, ",")+`]}`)
	if code != 200 || len(results) != len(items) {
		t.Fatalf("batch of 1000: %d, %d results: %.300s", code, len(results), body)
	}

	// The same deducts one by one, on the twin sales.
	outcome := func(code int, errCode string) string { return fmt.Sprintf("%d %s", code, errCode) }
	batchBySKU, singleBySKU := map[string]map[string]int{}, map[string]map[string]int{}
	count := func(m map[string]map[string]int, sku, o string) {
		if m[sku] == nil {
			m[sku] = map[string]int{}
		}
		m[sku][o]++
	}
	for i, item := range strings.Split(strings.Join(batchItems("s"), "\n"), "\n") {
		var it struct {
			SKU string `json:"sku"`
		}
		_ = json.Unmarshal([]byte(item), &it)
		path := "/v1/skus/" + it.SKU + "/deduct"
		if strings.Contains(it.SKU, " ") || it.SKU == "" {
			path = "/v1/skus/not-a-sku/deduct" // the path cannot carry it; compare the batch's 400 below
		}
		single, out := nodetest.Call(t, cl, "POST", path, item)
		errCode, _ := out["error"].(string)
		b := results[i]
		bsku := strings.Replace(it.SKU, "s", "b", 1)
		count(batchBySKU, bsku, outcome(b.Status, b.Error))
		count(singleBySKU, bsku, outcome(single, errCode))
		switch i {
		case 17, 33, 50, 91:
			if b.Status != 400 || b.Error != "bad_request" || (i != 33 && (single != 400 || errCode != "bad_request")) {
				t.Fatalf("malformed item %d: %+v", i, b)
			}
		case 77:
			if b.Status != 404 || b.Error != "unknown_sku" || single != 404 {
				t.Fatalf("item for no sale: batch %+v, single %d", b, single)
			}
		}
	}
	malformed := map[int]bool{17: true, 33: true, 50: true, 77: true, 91: true}
	buyers := map[string]int{} // well-formed items per sale
	for i := range items {
		if !malformed[i] {
			buyers[fmt.Sprintf("b%d", i%10)]++
		}
	}
	for k := range 10 {
		sku, total := fmt.Sprintf("b%d", k), 100
		if k >= 5 {
			total = 10
		}
		want := map[string]int{"200 ": min(buyers[sku], total)}
		if buyers[sku] > total {
			want["409 sold_out"] = buyers[sku] - total
		}
		for o, n := range want {
			if batchBySKU[sku][o] != n || singleBySKU[sku][o] != n {
				t.Fatalf("sale %s: batch %v, single deducts %v, want %v", sku, batchBySKU[sku], singleBySKU[sku], want)
			}
		}
	}

	// The same batch again: every win answers its order, nothing new sold.
	code, again, _ := postBatch(t, cl, `{"deducts":[`+strings.Join(items, ",")+`]}`)
	if code != 200 || len(again) != len(results) {
		t.Fatalf("batch re-sent: %d, %d results", code, len(again))
	}
	orders := map[string]bool{}
	for i := range results {
		if results[i].Status == 200 {
			if again[i].Status != 200 || again[i].OrderID != results[i].OrderID {
				t.Fatalf("item %d re-sent: %+v, first %+v", i, again[i], results[i])
			}
			if orders[results[i].OrderID] {
				t.Fatalf("order %s given to two items", results[i].OrderID)
			}
			orders[results[i].OrderID] = true
		} else if again[i].Status != results[i].Status || again[i].Error != results[i].Error {
			t.Fatalf("item %d re-sent: %+v, first %+v", i, again[i], results[i])
		}
	}
	for k := range 10 {
		a := nodetest.CheckLedger(t, cl, fmt.Sprintf("b%d", k))
		want := float64(min(buyers[fmt.Sprintf("b%d", k)], 100))
		if k >= 5 {
			want = 10
		}
		if a["sold"] != want {
			t.Fatalf("b%d sold %v, want %v", k, a["sold"], want)
		}
	}

	// The batch as a whole is refused only when it is not a batch.
	big := make([]string, 1001)
	for i := range big {
		big[i] = `{"sku":"b0","user":"x"}`
	}
	for _, bad := range []string{`[]`, `{"deducts":{}}`, `{"deducts":[1]}`, `not json`, `{"deducts":[` + strings.Join(big, ",") + `]}`} {
		if code, _, body := postBatch(t, cl, bad); code != 400 {
			t.Fatalf("batch %.40q: %d %s", bad, code, body)
		}
	}
	if code, results, _ := postBatch(t, cl, `{"deducts":[]}`); code != 200 || len(results) != 0 {
		t.Fatalf("an empty batch: %d %v", code, results)
	}
}

// TestBatch_RacingBatchesOverThreeNodes sends batches to every node at once
// for more buyers than units, each buyer's request id in two batches on two
// nodes (and now and then twice in one batch): a request id gets one
// answer, whichever batch carries it; no unit is sold twice; the answers
// add up to the stock.
func TestBatch_RacingBatchesOverThreeNodes(t *testing.T) {
	const units, buyers, perBatch = 300, 600, 50
	c := nodetest.StartCluster(t)
	if code, body := nodetest.Call(t, c.Client("n1"), "PUT", "/v1/skus/rb", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	waitForSaleEverywhere(t, c, "rb")
	type answer struct {
		node   string
		result batchItemResult
	}
	var mu sync.Mutex
	answers := map[int][]answer{}
	var wg sync.WaitGroup
	for copyN := range 2 {
		for start := 0; start < buyers; start += perBatch {
			node := c.IDs[(start/perBatch+copyN)%len(c.IDs)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				var items []string
				var who []int
				for b := start; b < start+perBatch; b++ {
					items = append(items, fmt.Sprintf(`{"sku":"rb","user":"u%d","request_id":"rb-%d"}`, b, b))
					who = append(who, b)
					if b%17 == 0 { // the same buyer twice in one batch
						items = append(items, fmt.Sprintf(`{"sku":"rb","user":"u%d","request_id":"rb-%d"}`, b, b))
						who = append(who, b)
					}
				}
				code, results, body := postBatch(t, c.Client(node), `{"deducts":[`+strings.Join(items, ",")+`]}`)
				if code != 200 || len(results) != len(items) {
					t.Errorf("batch on %s: %d %s", node, code, body)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for i, r := range results {
					answers[who[i]] = append(answers[who[i]], answer{node, r})
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	acked := map[string]bool{}
	for b := range buyers {
		as := answers[b]
		var order string
		for _, a := range as {
			switch a.result.Status {
			case 200:
				if order != "" && a.result.OrderID != order {
					t.Fatalf("buyer %d got orders %s and %s (%+v)", b, order, a.result.OrderID, as)
				}
				order = a.result.OrderID
			case 409, 429:
			default:
				t.Fatalf("buyer %d: %+v", b, a)
			}
		}
		if order != "" {
			if acked[order] {
				t.Fatalf("order %s acknowledged to two buyers", order)
			}
			acked[order] = true
		}
	}
	a := checkClusterLedgers(t, c, "rb", acked)
	if a["sold"] != float64(len(acked)) || a["orders"] != float64(len(acked)) {
		t.Fatalf("%d buyers won; the ledger says %v", len(acked), a)
	}
	if len(acked) != units {
		// Every buyer tried twice and the stock was half the buyers: all
		// of it sells unless answers said try_again.
		t.Logf("%d of %d units sold", len(acked), units)
	}
}
