// Package pki makes the certificates a cluster runs on when it has no PKI
// of its own (stockd cert): a CA, a node certificate whose Common Name is
// the node's id and whose SANs are the addresses it is reached at (usable
// as a TLS server and client both), and a client certificate for a
// service. Keys are ECDSA P-256, files PEM. Certificates from any other
// tool (openssl, cfssl, a company CA) work as well: a CN, SANs and the
// serverAuth and clientAuth usages are all stockd reads. It imports
// nothing of ours.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"stockd.dev/stockd/internal/fsutil"
)

// File names in a CA's directory.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// ValidityMax bounds a certificate's validity (ten years).
const ValidityMax = 10 * 366 * 24 * time.Hour

// ErrExists: a file stockd cert would write is there already; it never
// overwrites a key.
var ErrExists = errors.New("file exists")

// Issued is a certificate and its key, PEM-encoded.
type Issued struct {
	CertPEM, KeyPEM []byte
}

// NewCA makes a self-signed CA valid for validity from now.
func NewCA(name string, validity time.Duration) (Issued, error) {
	tmpl, err := template(name, validity)
	if err != nil {
		return Issued{}, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	tmpl.MaxPathLenZero = true
	return sign(tmpl, nil, nil)
}

// NodeCert makes node id's certificate, signed by ca: CN id, a SAN for
// each of hosts (an IP address or a DNS name), usable to serve and to
// dial. The id is what peers check; the SANs what their TLS checks.
func NodeCert(ca Issued, id string, hosts []string, validity time.Duration) (Issued, error) {
	if id == "" {
		return Issued{}, errors.New("a node certificate needs the node's id (-id)")
	}
	tmpl, err := template(id, validity)
	if err != nil {
		return Issued{}, err
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		switch ip := net.ParseIP(h); {
		case h == "":
		case ip != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		default:
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if len(tmpl.IPAddresses)+len(tmpl.DNSNames) == 0 {
		return Issued{}, errors.New("a node certificate needs the addresses the node is reached at (-host 10.0.0.1,n1.shop.internal)")
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	return signBy(tmpl, ca)
}

// ClientCert makes a service's client certificate, CN name, signed by ca.
func ClientCert(ca Issued, name string, validity time.Duration) (Issued, error) {
	if name == "" {
		return Issued{}, errors.New("a client certificate needs the client's name (-name)")
	}
	tmpl, err := template(name, validity)
	if err != nil {
		return Issued{}, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return signBy(tmpl, ca)
}

func template(cn string, validity time.Duration) (*x509.Certificate, error) {
	if validity <= 0 || validity > ValidityMax {
		return nil, fmt.Errorf("validity %s outside (0, %s]", validity, ValidityMax)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"stockd"}},
		NotBefore:    now.Add(-5 * time.Minute), // clocks a little apart still agree
		NotAfter:     now.Add(validity),
	}, nil
}

func signBy(tmpl *x509.Certificate, ca Issued) (Issued, error) {
	pair, err := tls.X509KeyPair(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		return Issued{}, fmt.Errorf("read the CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return Issued{}, fmt.Errorf("read the CA: %w", err)
	}
	if !caCert.IsCA {
		return Issued{}, errors.New("the CA certificate is not a CA")
	}
	if tmpl.NotAfter.After(caCert.NotAfter) {
		tmpl.NotAfter = caCert.NotAfter // a certificate outliving its CA would fail on that day anyway
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return Issued{}, fmt.Errorf("the CA key is a %T; stockd cert signs with ECDSA keys", pair.PrivateKey)
	}
	return sign(tmpl, caCert, key)
}

// sign makes a new P-256 key for tmpl and signs it by parent (nil: self).
func sign(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, err
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return Issued{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Issued{}, err
	}
	return Issued{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// LoadCA reads the CA in dir (ca.pem, ca-key.pem).
func LoadCA(dir string) (Issued, error) {
	cert, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return Issued{}, fmt.Errorf("read the CA: %w (make one with stockd cert ca -out %s)", err, dir)
	}
	key, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return Issued{}, fmt.Errorf("read the CA's key: %w", err)
	}
	return Issued{CertPEM: cert, KeyPEM: key}, nil
}

// Write puts is into dir as name.pem and name-key.pem (the key readable
// by its owner only). It refuses to overwrite either file.
func Write(dir, certFile, keyFile string, is Issued) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("%w: %s (move it away to make a new one)", ErrExists, filepath.Join(dir, f))
		}
	}
	if err := fsutil.WriteNew(filepath.Join(dir, keyFile), is.KeyPEM, 0o600); err != nil {
		return err
	}
	return fsutil.WriteNew(filepath.Join(dir, certFile), is.CertPEM, 0o644)
}
