package main

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// startEtcd runs a single-member etcd inside this process. It lives here
// rather than in a child process because nothing in it clashes with the
// Kubernetes components' process-wide state, and it is one less thing to
// supervise.
func startEtcd(dir string, clientPort, peerPort int, timeout time.Duration) (*embed.Etcd, string, error) {
	cfg := embed.NewConfig()
	cfg.Name = "testenv"
	cfg.Dir = dir
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// The data is deleted on exit, so durability buys nothing, and fsync
	// latency on a busy disk would show up as slow API calls in tests.
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "warn"
	// Left at zero, every request counts as slow and is logged as a warning.
	cfg.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("starting embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, clientURL.String(), nil
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd failed: %w", err)
	case <-time.After(timeout):
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd not ready after %s", timeout)
	}
}
