package promidem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of a Config.
const (
	DefaultPollInterval = 30 * time.Second
	DefaultPollTimeout  = 5 * time.Second
)

var (
	// DefaultStoreBuckets (seconds) resolve a store's P99 around seed 001's
	// 50 ms target.
	DefaultStoreBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	// DefaultHoldBuckets (seconds) span fast handlers to a lease or two.
	DefaultHoldBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	// DefaultDelayBuckets (seconds) span an outbox relay's commit-to-publish
	// delay from a notified wake-up to an hour-long broker outage.
	DefaultDelayBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// Config configures a Collector. Zero values take the documented defaults.
type Config struct {
	// Namespace, when set, becomes the constant label idem_namespace on
	// every metric, so collectors of several idem namespaces can share a
	// registry. (Not "namespace": Kubernetes service discovery attaches a
	// target label of that name, which would rename this one to
	// exported_namespace.)
	Namespace string
	// ConstLabels are added to every metric, e.g. {"consumer": "orders"}
	// for a collector per consumer. Keep their values few.
	ConstLabels prometheus.Labels
	// StoreBuckets, HoldBuckets and DelayBuckets are histogram upper
	// bounds in seconds (defaults above).
	StoreBuckets []float64
	HoldBuckets  []float64
	DelayBuckets []float64
	// PollInterval is how long a polled value (record counts, broker lag)
	// is reused before a scrape polls again (default 30s): counting the
	// records of a large SQL table is a scan. Negative: poll every scrape.
	PollInterval time.Duration
	// PollTimeout bounds one poll at scrape time (default 5s).
	PollTimeout time.Duration
}

// Validate reports a bad configuration.
func (c Config) Validate() error {
	if c.PollTimeout < 0 {
		return errors.New("promidem: negative PollTimeout")
	}
	if _, ok := c.ConstLabels[labelNamespace]; ok && c.Namespace != "" {
		return fmt.Errorf("promidem: ConstLabels has %s and Namespace is set", labelNamespace)
	}
	for _, b := range [][]float64{c.StoreBuckets, c.HoldBuckets, c.DelayBuckets} {
		for i := range b {
			if math.IsNaN(b[i]) || (i > 0 && b[i] <= b[i-1]) {
				return errors.New("promidem: histogram buckets must be increasing")
			}
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.StoreBuckets == nil {
		c.StoreBuckets = DefaultStoreBuckets
	}
	if c.HoldBuckets == nil {
		c.HoldBuckets = DefaultHoldBuckets
	}
	if c.DelayBuckets == nil {
		c.DelayBuckets = DefaultDelayBuckets
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.PollTimeout == 0 {
		c.PollTimeout = DefaultPollTimeout
	}
	return c
}

// Collector is a prometheus.Collector for idem. Plug its hooks into a
// guard (GuardHooks), a consumer (ConsumerHooks) and an outbox relay
// (OutboxHooks), point it at what can be polled (WatchStore,
// WatchConsumer, WatchLag), and register it:
//
//	col, _ := promidem.New(promidem.Config{Namespace: "orders"})
//	prometheus.MustRegister(col)
//	guard, _ := idem.NewGuard(store, idem.WithHooks(col.GuardHooks()))
//
// A Collector exports the families of the sources plugged into it: the
// guard's once GuardHooks was called, the consumer's once ConsumerHooks
// was, and so on; from then on every series of those families with a
// fixed label set exists at zero, so rates and ratios are defined before
// the first event. Hooks are safe for concurrent use and cost a few
// atomic adds per event.
type Collector struct {
	cfg   Config
	descs []*prometheus.Desc // polled metrics
	vecs  []sourced
	// used[src]: the hooks of src were handed out (or, for srcPoll, a
	// store or subscription is watched); only those families are
	// collected, so a collector used for record counts alone exports no
	// zero guard or consumer series.
	used [numSources]atomic.Bool

	claims        [7]prometheus.Counter
	takeovers     prometheus.Counter
	settles       [3][4]prometheus.Counter
	leasesLost    prometheus.Counter
	storeErrors   [4][7]prometheus.Counter
	storeDuration [4]prometheus.Observer
	holdDuration  [3]prometheus.Observer
	failOpen      prometheus.Counter
	unrecorded    [3]prometheus.Counter

	acks           [2]prometheus.Counter
	naks           prometheus.Counter
	holds          [5]prometheus.Counter
	holdRetries    [5]prometheus.Counter
	deadLetters    [3]prometheus.Counter
	unrecordedAcks prometheus.Counter

	outboxPublished prometheus.Counter
	outboxPubDur    prometheus.Observer
	outboxDelay     prometheus.Observer
	outboxRetries   prometheus.Counter
	outboxFailures  prometheus.Counter
	outboxErrors    [6]prometheus.Counter
	pollErrors      [2]prometheus.Counter

	recordsDesc, inFlightDesc, heldDesc, settleErrDesc, lostDesc, lagDesc *prometheus.Desc
	outboxMsgDesc, outboxOldestDesc                                       *prometheus.Desc

	mu        sync.Mutex // guards what follows; held across a poll
	staters   []idem.Stater
	consumers []StatsSource
	lags      []broker.LagReporter
	records   polled[idem.Stats]
	lag       polled[int64]
	outbox    struct {
		seen                    bool
		pending, failed, oldest float64
	}
}

// sourced is a metric vector and the source that feeds it.
type sourced struct {
	src int
	v   prometheus.Collector
}

const (
	srcGuard = iota
	srcConsumer
	srcOutbox
	srcPoll
	numSources
)

func sourceIndex(source string) int {
	switch source {
	case sourceGuard:
		return srcGuard
	case sourceConsumer:
		return srcConsumer
	case sourceOutbox:
		return srcOutbox
	}
	return srcPoll
}

// StatsSource is what WatchConsumer reads: *consumer.Consumer.
type StatsSource interface{ Stats() consumer.Stats }

// polled caches one polled value.
type polled[T any] struct {
	at  time.Time // when v was polled; zero: never
	v   T
	err error
}

// New returns a Collector; register it with a prometheus.Registerer.
func New(cfg Config) (*Collector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Collector{cfg: cfg}
	cl := prometheus.Labels{}
	for k, v := range cfg.ConstLabels {
		cl[k] = v
	}
	if cfg.Namespace != "" {
		cl[labelNamespace] = cfg.Namespace
	}
	counter := func(name string) *prometheus.CounterVec {
		d := defOf(name)
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: d.name, Help: d.help, ConstLabels: cl}, d.labels)
		c.vecs = append(c.vecs, sourced{sourceIndex(d.source), v})
		return v
	}
	histogram := func(name string, buckets []float64) *prometheus.HistogramVec {
		d := defOf(name)
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: d.name, Help: d.help, ConstLabels: cl, Buckets: buckets}, d.labels)
		c.vecs = append(c.vecs, sourced{sourceIndex(d.source), v})
		return v
	}
	desc := func(name string) *prometheus.Desc {
		d := defOf(name)
		return prometheus.NewDesc(d.name, d.help, d.labels, cl)
	}
	one := func(name string) prometheus.Counter { return counter(name).WithLabelValues() }
	each := func(v *prometheus.CounterVec, dst []prometheus.Counter, values []string) {
		for i, x := range values {
			dst[i] = v.WithLabelValues(x)
		}
	}

	each(counter(mClaims), c.claims[:], claimOutcomes)
	c.takeovers = one(mTakeovers)
	settles := counter(mSettles)
	for i, a := range settleActions {
		for j, r := range settleResults {
			c.settles[i][j] = settles.WithLabelValues(a, r)
		}
	}
	c.leasesLost = one(mLeasesLost)
	se := counter(mStoreErrors)
	for i, op := range storeOps {
		for j, cls := range errorClasses {
			c.storeErrors[i][j] = se.WithLabelValues(op, cls)
		}
	}
	sd := histogram(mStoreDuration, cfg.StoreBuckets)
	for i, op := range storeOps {
		c.storeDuration[i] = sd.WithLabelValues(op)
	}
	hd := histogram(mHoldDuration, cfg.HoldBuckets)
	for i, a := range settleActions {
		c.holdDuration[i] = hd.WithLabelValues(a)
	}
	c.failOpen = one(mFailOpen)
	each(counter(mUnrecorded), c.unrecorded[:], unrecPhases)

	each(counter(mAcks), c.acks[:], ackResults)
	c.naks = one(mNaks)
	each(counter(mHolds), c.holds[:], holdReasons)
	each(counter(mHoldRetries), c.holdRetries[:], holdReasons)
	each(counter(mDeadLetters), c.deadLetters[:], deadResults)
	c.unrecordedAcks = one(mUnrecordedAcks)

	c.outboxPublished = one(mOutboxPublished)
	c.outboxPubDur = histogram(mOutboxPubDur, cfg.StoreBuckets).WithLabelValues()
	c.outboxDelay = histogram(mOutboxDelay, cfg.DelayBuckets).WithLabelValues()
	c.outboxRetries = one(mOutboxRetries)
	c.outboxFailures = one(mOutboxFailures)
	each(counter(mOutboxErrors), c.outboxErrors[:], outboxOps)
	each(counter(mPollErrors), c.pollErrors[:], pollSources)

	c.recordsDesc = desc(mRecords)
	c.inFlightDesc = desc(mInFlight)
	c.heldDesc = desc(mHeld)
	c.settleErrDesc = desc(mSettleErrors)
	c.lostDesc = desc(mLostDeliveries)
	c.lagDesc = desc(mLag)
	c.outboxMsgDesc = desc(mOutboxMessages)
	c.outboxOldestDesc = desc(mOutboxOldest)
	c.descs = []*prometheus.Desc{c.recordsDesc, c.inFlightDesc, c.heldDesc, c.settleErrDesc, c.lostDesc, c.lagDesc, c.outboxMsgDesc, c.outboxOldestDesc}
	return c, nil
}

// WatchStore adds a store whose records are counted by state
// (idem_records) at scrape time, at most once per PollInterval. Stores of
// one namespace only: counts of several stores are summed.
func (c *Collector) WatchStore(s idem.Stater) {
	c.mu.Lock()
	c.staters = append(c.staters, s)
	c.records.at = time.Time{}
	c.mu.Unlock()
	c.used[srcPoll].Store(true)
}

// WatchConsumer adds a consumer whose in-flight and held deliveries and
// broker settle errors are read at scrape time (summed over consumers).
func (c *Collector) WatchConsumer(s StatsSource) {
	c.mu.Lock()
	c.consumers = append(c.consumers, s)
	c.mu.Unlock()
}

// WatchLag adds a subscription whose lag is polled at scrape time, at most
// once per PollInterval (summed over subscriptions). Subscribers that
// report lag implement broker.LagReporter:
//
//	if lr, ok := sub.(broker.LagReporter); ok {
//		col.WatchLag(lr)
//	}
func (c *Collector) WatchLag(r broker.LagReporter) {
	c.mu.Lock()
	c.lags = append(c.lags, r)
	c.lag.at = time.Time{}
	c.mu.Unlock()
	c.used[srcPoll].Store(true)
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs {
		v.v.Describe(ch)
	}
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It polls watched stores and
// subscriptions whose last poll is older than PollInterval, each bounded
// by PollTimeout; a failed poll leaves its metric out of this scrape and
// counts in idem_poll_errors_total.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.collectPolled(ch)
	for _, v := range c.vecs { // after the polls: their errors count now
		if c.used[v.src].Load() {
			v.v.Collect(ch)
		}
	}
}

func (c *Collector) collectPolled(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if len(c.staters) > 0 {
		poll(c, &c.records, now, 0, func(ctx context.Context) (idem.Stats, error) {
			var sum idem.Stats
			for _, s := range c.staters {
				st, err := s.Stats(ctx)
				if err != nil {
					return idem.Stats{}, err
				}
				sum.InProgress += st.InProgress
				sum.Completed += st.Completed
				sum.Failed += st.Failed
				sum.Released += st.Released
			}
			return sum, nil
		})
		if c.records.err == nil {
			st := c.records.v
			for i, n := range []int64{st.InProgress, st.Completed, st.Failed, st.Released} {
				ch <- prometheus.MustNewConstMetric(c.recordsDesc, prometheus.GaugeValue, float64(n), recordStates[i])
			}
		}
	}
	if len(c.lags) > 0 {
		poll(c, &c.lag, now, 1, func(ctx context.Context) (int64, error) {
			var sum int64
			for _, r := range c.lags {
				n, err := r.Lag(ctx)
				if err != nil {
					return 0, err
				}
				sum += n
			}
			return sum, nil
		})
		if c.lag.err == nil {
			ch <- prometheus.MustNewConstMetric(c.lagDesc, prometheus.GaugeValue, float64(c.lag.v))
		}
	}
	if len(c.consumers) > 0 {
		var inFlight, held, settleErrs, lost int64
		for _, s := range c.consumers {
			st := s.Stats()
			inFlight += st.InFlight
			held += st.HeldNow
			settleErrs += st.SettleErrors
			lost += st.Lost
		}
		ch <- prometheus.MustNewConstMetric(c.inFlightDesc, prometheus.GaugeValue, float64(inFlight))
		ch <- prometheus.MustNewConstMetric(c.heldDesc, prometheus.GaugeValue, float64(held))
		ch <- prometheus.MustNewConstMetric(c.settleErrDesc, prometheus.CounterValue, float64(settleErrs))
		ch <- prometheus.MustNewConstMetric(c.lostDesc, prometheus.CounterValue, float64(lost))
	}
	if c.outbox.seen {
		ch <- prometheus.MustNewConstMetric(c.outboxMsgDesc, prometheus.GaugeValue, c.outbox.pending, outboxStatuses[0])
		ch <- prometheus.MustNewConstMetric(c.outboxMsgDesc, prometheus.GaugeValue, c.outbox.failed, outboxStatuses[1])
		ch <- prometheus.MustNewConstMetric(c.outboxOldestDesc, prometheus.GaugeValue, c.outbox.oldest)
	}
}

// poll refreshes p when it is older than PollInterval; caller holds c.mu.
func poll[T any](c *Collector, p *polled[T], now time.Time, source int, f func(context.Context) (T, error)) {
	if !p.at.IsZero() && now.Sub(p.at) < c.cfg.PollInterval {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.PollTimeout)
	defer cancel()
	v, err := f(ctx)
	p.at, p.v, p.err = now, v, err
	if err != nil {
		c.pollErrors[source].Inc()
	}
}
