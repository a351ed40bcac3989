package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/idem-dev/idem"
	"github.com/twmb/franz-go/pkg/kgo"
)

type partitionFunc = func(context.Context, *kgo.Client, map[string][]int32)

// partitionCallbacks are OnPartitionsAssigned, OnPartitionsRevoked and
// OnPartitionsLost as given in SubscriberConfig.ClientOpts.
type partitionCallbacks struct {
	assigned, revoked, lost partitionFunc
}

var errProbeDial = errors.New("kafkabroker: options probe does not connect")

// userCallbacks reads the partition callbacks set in opts. franz-go keeps
// one function per callback (the last option wins) and only a client
// reports an option's value, so opts are evaluated once in a client that
// consumes nothing, cannot dial, pushes no metrics, and is closed at once.
// Hooks in opts that observe clients (HookNewClient, HookClientClosed) see
// that client come and go.
func userCallbacks(opts []kgo.Opt) (partitionCallbacks, error) {
	if len(opts) == 0 {
		return partitionCallbacks{}, nil
	}
	probe, err := kgo.NewClient(append(slices.Clone(opts),
		kgo.ConsumerGroup("kafkabroker-options-probe"), // callbacks need a group
		kgo.ConsumeTopics(),                            // nothing to join for
		kgo.DisableClientMetrics(),
		kgo.Dialer(func(context.Context, string, string) (net.Conn, error) { return nil, errProbeDial }),
	)...)
	if err != nil {
		return partitionCallbacks{}, fmt.Errorf("%w: kafkabroker: ClientOpts: %w", idem.ErrInvalidArgument, err)
	}
	defer probe.Close()
	get := func(opt any) partitionFunc {
		f, _ := probe.OptValue(opt).(partitionFunc)
		return f
	}
	return partitionCallbacks{
		assigned: get(kgo.OnPartitionsAssigned),
		revoked:  get(kgo.OnPartitionsRevoked),
		lost:     get(kgo.OnPartitionsLost),
	}, nil
}
