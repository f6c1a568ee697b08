// Command etcd runs the test cluster's etcd: go.etcd.io/etcd/server/v3/embed
// in one process, with the data directory and client URL from flags, until
// SIGTERM or SIGINT.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "where etcd keeps its data (required)")
	client := flag.String("listen-client-url", "http://127.0.0.1:2379", "the URL clients connect to")
	peer := flag.String("listen-peer-url", "http://127.0.0.1:2380", "the URL of the (single) peer")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("etcd: --data-dir is required")
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = "warn"
	clientURL, err := url.Parse(*client)
	if err != nil {
		log.Fatalf("etcd: --listen-client-url %q: %v", *client, err)
	}
	peerURL, err := url.Parse(*peer)
	if err != nil {
		log.Fatalf("etcd: --listen-peer-url %q: %v", *peer, err)
	}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	server, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: starting in %s: %v", *dataDir, err)
	}
	defer server.Close()
	select {
	case <-server.Server.ReadyNotify():
		log.Printf("etcd: ready at %s", clientURL)
	case <-time.After(60 * time.Second):
		log.Fatal("etcd: not ready within 60 s")
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case sig := <-stop:
		log.Printf("etcd: %v, stopping", sig)
	case err := <-server.Err():
		log.Fatalf("etcd: %v", err)
	}
}
