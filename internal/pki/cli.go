package pki

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"
)

const certUsage = `usage:
  stockd cert ca -out DIR [-days N]
      a CA: DIR/ca.pem and DIR/ca-key.pem (keep the key off the nodes)
  stockd cert node -ca DIR -id ID -host ADDR[,ADDR...] -out DIR [-days N]
      node ID's certificate: CN ID, a SAN for each address (IP or DNS name)
      it is reached at; DIR/ID.pem and DIR/ID-key.pem
  stockd cert client -ca DIR -name NAME -out DIR [-days N]
      a service's client certificate: CN NAME; DIR/NAME.pem and DIR/NAME-key.pem
`

// Main is stockd cert. It never overwrites a file.
func Main(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, certUsage)
		return flag.ErrHelp
	}
	kind, args := args[0], args[1:]
	fs := flag.NewFlagSet("stockd cert "+kind, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, certUsage) }
	out := fs.String("out", ".", "directory to write the files to")
	days := fs.Int("days", 0, "validity in days (default: 3650 for a CA, 825 for others)")
	caDir := fs.String("ca", "", "directory of the CA (ca.pem, ca-key.pem) that signs")
	id := fs.String("id", "", "node: the node's id (its -id), the certificate's CN")
	hosts := fs.String("host", "", "node: comma-separated IP addresses and DNS names it is reached at")
	name := fs.String("name", "", "client: the service's name, the certificate's CN")
	if err := fs.Parse(args); err != nil {
		return err
	}
	validity := func(def int) time.Duration {
		if *days == 0 {
			*days = def
		}
		return time.Duration(*days) * 24 * time.Hour
	}
	var is Issued
	var base string
	var err error
	switch kind {
	case "ca":
		base = "ca"
		is, err = NewCA("stockd CA", validity(3650))
	case "node", "client":
		var ca Issued
		if *caDir == "" {
			return fmt.Errorf("stockd cert %s needs -ca DIR (made by stockd cert ca)", kind)
		}
		if ca, err = LoadCA(*caDir); err != nil {
			return err
		}
		if kind == "node" {
			base = *id
			is, err = NodeCert(ca, *id, strings.Split(*hosts, ","), validity(825))
		} else {
			base = *name
			is, err = ClientCert(ca, *name, validity(825))
		}
	default:
		fmt.Fprint(stderr, certUsage)
		return fmt.Errorf("unknown certificate kind %q (ca, node, client)", kind)
	}
	if err != nil {
		return err
	}
	if strings.ContainsAny(base, `/\`) || base == "" || base == "." || base == ".." {
		return errors.New("the name must be usable as a file name")
	}
	certFile, keyFile := base+".pem", base+"-key.pem"
	if err := Write(*out, certFile, keyFile, is); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s and %s (valid %d days)\n", filepath.Join(*out, certFile), filepath.Join(*out, keyFile), *days)
	return nil
}
