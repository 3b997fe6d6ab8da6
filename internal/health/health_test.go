package health

import "testing"

func TestDefaultTarget_IsTheNodeOnLoopback(t *testing.T) {
	f := func(addr string, https bool, want string) {
		t.Helper()
		got, err := defaultTarget(addr, https)
		if err != nil || got != want {
			t.Fatalf("defaultTarget(%q, %v) = %q, %v; want %q", addr, https, got, err, want)
		}
	}
	f("", false, "http://127.0.0.1:8080")
	f("0.0.0.0:8081", false, "http://127.0.0.1:8081")
	f(":8082", true, "https://127.0.0.1:8082")
	f("[::]:8083", false, "http://[::1]:8083")
	f("10.0.0.1:8084", true, "https://10.0.0.1:8084")
	if _, err := defaultTarget("8080", false); err == nil {
		t.Fatal("STOCKD_HTTP without a port was taken")
	}
}
