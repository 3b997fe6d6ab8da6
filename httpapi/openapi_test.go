package httpapi

import (
	"context"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestOpenAPI_DocumentIsValid: the embedded document loads and passes
// kin-openapi's validation, and names every public route with the
// statuses the contract gives the deduct.
func TestOpenAPI_DocumentIsValid(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(openAPIDocument)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the OpenAPI document is not valid: %v", err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Fatalf("openapi %q, want 3.0.3", doc.OpenAPI)
	}
	routes := map[string][]string{
		"/v1/skus/{sku}": {"GET", "PUT"}, "/v1/skus/{sku}/deduct": {"POST"}, "/v1/deducts": {"POST"},
		"/v1/skus/{sku}/restock": {"POST"}, "/v1/skus/{sku}/close": {"POST"}, "/v1/skus/{sku}/archive": {"POST"},
		"/v1/skus/{sku}/audit": {"GET"}, "/v1/skus/{sku}/orders": {"GET"}, "/v1/skus/{sku}/enter": {"POST"},
		"/v1/skus/{sku}/entries": {"GET"}, "/v1/skus/{sku}/entries/{user}": {"GET"}, "/v1/skus/{sku}/draw": {"GET"},
		"/v1/orders/{id}": {"GET"}, "/v1/orders/{id}/confirm": {"POST"}, "/v1/orders/{id}/cancel": {"POST"},
		"/v1/events": {"GET"}, "/v1/consumers": {"GET"}, "/v1/consumers/{name}": {"PUT", "DELETE"},
		"/v1/cluster": {"GET"}, "/v1/cluster/join": {"POST"}, "/v1/cluster/nodes/{id}": {"DELETE"}, "/v1/backup": {"GET"},
		"/v1/stats": {"GET"}, "/v1/openapi.json": {"GET"}, "/ui": {"GET"}, "/q/{sku}": {"GET"}, "/healthz": {"GET"}, "/readyz": {"GET"}, "/metrics": {"GET"},
		"/v1/skus/{sku}/queue": {"POST", "GET"}, "/v1/skus/{sku}/queue/tickets": {"GET"}, "/v1/skus/{sku}/queue/rotate": {"POST"},
		"/v1/queue/{ticket}": {"GET"},
	}
	for path, methods := range routes {
		item := doc.Paths.Find(path)
		if item == nil {
			t.Fatalf("route %s is not in the document", path)
		}
		for _, m := range methods {
			if item.GetOperation(m) == nil {
				t.Fatalf("%s %s is not in the document", m, path)
			}
		}
	}
	if n := doc.Paths.Len(); n != len(routes) {
		t.Fatalf("the document has %d paths, the test knows %d", n, len(routes))
	}
	deduct := doc.Paths.Find("/v1/skus/{sku}/deduct").Post
	for _, status := range []int{200, 202, 400, 403, 404, 409, 422, 425, 429, 503, 504} {
		if deduct.Responses.Status(status) == nil {
			t.Fatalf("the deduct's %d is not in the document", status)
		}
	}
}
