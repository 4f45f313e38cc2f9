package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// pki is the set of credentials a fresh cluster needs. Everything is made
// anew for each run, so no secret outlives the cluster it belongs to.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
}

// File names inside pki.dir, shared by the writer and the component flags.
const (
	caCertFile      = "ca.crt"
	caKeyFile       = "ca.key"
	servingCertFile = "apiserver.crt"
	servingKeyFile  = "apiserver.key"
	// The ServiceAccount token signing key; the apiserver also accepts the
	// private key as its verification key, so one file serves both flags.
	saKeyFile = "sa.key"
)

func newPKI(dir string) (*pki, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	tmpl := certTemplate("testenv-ca")
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-signing the cluster CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caCert: caCert, caKey: key}
	if err := p.writePair(caCertFile, caKeyFile, der, key); err != nil {
		return nil, err
	}

	serving := certTemplate("kube-apiserver")
	serving.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	// Clients reach the apiserver on loopback; the in-cluster names and the
	// first service IP are there so that the certificate is also valid for
	// what the apiserver advertises as the `kubernetes` Service.
	serving.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.ParseIP(kubernetesServiceIP)}
	serving.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	certDER, certKey, err := p.issue(serving)
	if err != nil {
		return nil, err
	}
	if err := p.writePair(servingCertFile, servingKeyFile, certDER, certKey); err != nil {
		return nil, err
	}

	saKey, err := newKey()
	if err != nil {
		return nil, err
	}
	return p, writeKey(p.path(saKeyFile), saKey)
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// writeKubeconfig writes a self-contained kubeconfig (certificates inline)
// for a client certificate with the given user and groups. The apiserver's
// RBAC sees that identity, so each component gets exactly the rights its
// bootstrap ClusterRole grants, as in a real cluster.
func (p *pki) writeKubeconfig(path, server, user string, groups ...string) error {
	tmpl := certTemplate(user)
	tmpl.Subject.Organization = groups
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	certDER, key, err := p.issue(tmpl)
	if err != nil {
		return err
	}
	keyPEM, err := ecKeyPEM(key)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{
		Server:                   server,
		CertificateAuthorityData: pemBytes("CERTIFICATE", p.caCert.Raw),
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: pemBytes("CERTIFICATE", certDER),
		ClientKeyData:         keyPEM,
	}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: user}
	cfg.CurrentContext = "testenv"
	return clientcmd.WriteToFile(*cfg, path)
}

// issue signs a fresh key's certificate with the cluster CA.
func (p *pki) issue(tmpl *x509.Certificate) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the certificate of %s: %w", tmpl.Subject.CommonName, err)
	}
	return der, key, nil
}

func (p *pki) writePair(certName, keyName string, certDER []byte, key *ecdsa.PrivateKey) error {
	if err := os.WriteFile(p.path(certName), pemBytes("CERTIFICATE", certDER), 0o600); err != nil {
		return err
	}
	return writeKey(p.path(keyName), key)
}

func certTemplate(commonName string) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		// Backdated so that a client whose clock is slightly behind still
		// accepts it; a year is far longer than any test environment lives.
		NotBefore: now.Add(-time.Hour),
		NotAfter:  now.Add(365 * 24 * time.Hour),
		KeyUsage:  x509.KeyUsageDigitalSignature,
	}
}

// P-256 keys: as good as RSA for this purpose and generated in microseconds.
func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// ecKeyPEM encodes a key in SEC 1 form: the apiserver reads a public key
// out of an EC private key file only in that form, not in PKCS #8.
func ecKeyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pemBytes("EC PRIVATE KEY", der), nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	keyPEM, err := ecKeyPEM(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, keyPEM, 0o600)
}

func pemBytes(blockType string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
}
