package main

// NATS JetStream, a peer: watermill-nats v2 (its primary
// package, pkg/nats, with JetStream on) against a nats-server embedded in
// this process, started for each run on 127.0.0.1 and a free port with its
// store in a temporary directory, and shut down (directory removed) when
// the run ends. Two variants: the server's defaults (the file store
// fsyncs every 2 minutes) and SyncAlways (an fsync on every write).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
)

const (
	natsName     = "NATS JetStream"
	natsSyncName = "NATS JetStream, sync always"

	// natsReadyTimeout bounds the wait for the embedded server to accept
	// connections.
	natsReadyTimeout = 10 * time.Second
)

// errNoMembers is what the peers return for handle.member: the
// consumer-group workloads run on the PostgreSQL backends only.
var errNoMembers = errors.New("no consumer-group members: the group workloads do not run on this backend")

// natsBackend is NATS JetStream with the server's default settings, or
// with SyncAlways.
type natsBackend struct{ syncAlways bool }

func (b natsBackend) name() string {
	if b.syncAlways {
		return natsSyncName
	}
	return natsName
}

func (b natsBackend) short() string {
	if b.syncAlways {
		return "natssync"
	}
	return "nats"
}

// open starts a server of its own for the run; ns is not used (the server
// holds nothing else).
func (b natsBackend) open(_ context.Context, e *env, _ string) (handle, error) {
	dir, err := os.MkdirTemp("", "pglease-bench-nats-")
	if err != nil {
		return nil, fmt.Errorf("NATS store directory: %w", err)
	}
	srv, err := startNATS(natsOptions(dir, b.syncAlways))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &natsHandle{e: e, srv: srv, dir: dir}, nil
}

// natsOptions are the embedded server's options: JetStream on, its store in
// dir, listening on 127.0.0.1 only, on a port the system picks; SyncAlways
// as asked, everything else the server's default.
func natsOptions(dir string, syncAlways bool) *server.Options {
	return &server.Options{
		ServerName: "pglease-bench",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		NoLog:      true,
		NoSigs:     true, // the benchmark handles SIGINT and SIGTERM
		JetStream:  true,
		StoreDir:   dir,
		SyncAlways: syncAlways,
	}
}

// startNATS starts an embedded server and waits until it accepts
// connections with JetStream enabled.
func startNATS(opts *server.Options) (*server.Server, error) {
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("NATS server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(natsReadyTimeout) {
		srv.Shutdown()
		return nil, fmt.Errorf("NATS server: not ready for connections within %s", natsReadyTimeout)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		return nil, errors.New("NATS server: JetStream did not start")
	}
	return srv, nil
}

type natsHandle struct {
	e   *env
	srv *server.Server
	dir string
}

// publisher: watermill-nats's default configuration with JetStream, except
// that it does not provision streams: initTopic creates them beforehand, as
// the PostgreSQL backends' tables are (with AutoProvision every Publish
// call would first ask the server for the stream).
func (h *natsHandle) publisher() (message.Publisher, error) {
	return wnats.NewPublisher(wnats.PublisherConfig{
		URL:       h.srv.ClientURL(),
		JetStream: wnats.JetStreamConfig{},
	}, h.e.logger)
}

func (h *natsHandle) subscriber() (message.Subscriber, error) {
	return h.newSubscriber()
}

// newSubscriber: the default configuration with JetStream, a durable
// consumer and queue group named after the consumer group (the consumer
// group of the PostgreSQL backends), and streams provisioned on Subscribe.
// Acks are synchronous (AckAsync false, the default).
func (h *natsHandle) newSubscriber() (*wnats.Subscriber, error) {
	return wnats.NewSubscriber(wnats.SubscriberConfig{
		URL:              h.srv.ClientURL(),
		QueueGroupPrefix: consumerGroup,
		JetStream: wnats.JetStreamConfig{
			AutoProvision: true,
			DurablePrefix: consumerGroup,
		},
	}, h.e.logger)
}

func (h *natsHandle) member() (message.Subscriber, func() error, error) {
	return nil, nil, errNoMembers
}

// initTopic creates topic's stream (file storage, the defaults of
// watermill-nats's provisioning).
func (h *natsHandle) initTopic(_ context.Context, topic string) error {
	sub, err := h.newSubscriber()
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(topic)
}

// close shuts the server down and removes its store.
func (h *natsHandle) close(_ context.Context) error {
	h.srv.Shutdown()
	h.srv.WaitForShutdown()
	if err := os.RemoveAll(h.dir); err != nil {
		return fmt.Errorf("remove the NATS store: %w", err)
	}
	return nil
}
