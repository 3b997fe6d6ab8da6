// Package health is `stockd health`: it asks a node whether it is ready
// (GET /readyz) and exits 0 when it is, else 1 with the reason. It needs
// no shell or curl, so a container image FROM scratch can run it as its
// health check.
package health

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"stockd.dev/stockd/client"
)

// Main runs `stockd health [-target URL] [-ca F -cert F -key F] [-timeout D]`.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stockd health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "", "the node's URL (default: from STOCKD_HTTP, the node's -http, on loopback; https when -ca is given or STOCKD_HTTP_CERT is set)")
	caFile := fs.String("ca", os.Getenv("STOCKD_HEALTH_CA"), "CA bundle (PEM) that checks an https:// node (default $STOCKD_HEALTH_CA)")
	certFile := fs.String("cert", "", "client certificate (PEM) (a node with -http-client-ca needs none for /readyz)")
	keyFile := fs.String("key", "", "the key of -cert (PEM)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd health [-target URL] [-ca F [-cert F -key F]] [-timeout D]\n\nExit 0 when the node is ready, else 1 with the reason.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	url := *target
	if url == "" {
		var err error
		if url, err = defaultTarget(os.Getenv("STOCKD_HTTP"), *caFile != "" || os.Getenv("STOCKD_HTTP_CERT") != ""); err != nil {
			return err
		}
	}
	var tlsCfg *tls.Config
	if *caFile != "" || *certFile != "" {
		var err error
		if tlsCfg, err = client.TLSFiles(*caFile, *certFile, *keyFile); err != nil {
			return fmt.Errorf("TLS files: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	msg, err := check(ctx, strings.TrimRight(url, "/")+"/readyz", tlsCfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s\n", url, msg)
	return nil
}

// defaultTarget is the URL of the node listening on addr (its -http), on
// loopback when it listens on every address.
func defaultTarget(addr string, https bool) (string, error) {
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("STOCKD_HTTP %q is not host:port: %w", addr, err)
	}
	switch ip := net.ParseIP(host); {
	case host == "":
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified() && ip.To4() != nil:
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified():
		host = "::1"
	}
	scheme := "http"
	if https {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port), nil
}

// check asks url and says why the node is not ready, if it is not.
func check(ctx context.Context, url string, tlsCfg *tls.Config) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return "", fmt.Errorf("no answer from %s in time: %w", url, err)
		}
		return "", fmt.Errorf("unreachable: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	var r struct {
		Ready  bool   `json:"ready"`
		Leader string `json:"leader"`
		Reason string `json:"reason"`
		Detail string `json:"detail"`
		Index  uint64 `json:"applied_index"`
	}
	_ = json.Unmarshal(body, &r)
	if resp.StatusCode == http.StatusOK && r.Ready {
		return fmt.Sprintf("ready (leader %s, applied index %d)", r.Leader, r.Index), nil
	}
	reason := strings.TrimSpace(r.Reason + " " + r.Detail)
	if reason == "" {
		reason = strings.TrimSpace(string(body))
	}
	return "", fmt.Errorf("not ready: %s %s", resp.Status, reason)
}
