// Package shm is a small file of int64 counters that a worker process
// updates and the harness reads through a shared memory mapping. The harness
// stops a worker (SIGSTOP) before it kills it and reads the counters then:
// they are exactly what the process held when it died, which a report sent
// over a pipe, always a little late, cannot say.
package shm

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Slot names one counter.
type Slot int

// The counters. Gauges go up and down; the others only grow.
const (
	Pid            Slot = iota // the writer's pid, set at Open
	Alive                      // unix ms of the worker's last tick
	Fetched                    // deliveries received
	Unsettled                  // gauge: deliveries received and not yet acked, nak'ed or terminated
	InHandler                  // gauge: handlers running (each holds its claim)
	Effects                    // effects committed (ledger rows written by this process)
	Fenced                     // effects refused because the claim's token was no longer current
	Reruns                     // effects found already applied by an earlier holder (fence table)
	LeaseLost                  // guard: claims found taken over while held
	StoreErrors                // consumer: claims or settles that failed on the store
	Duplicates                 // consumer: deliveries of keys already completed (acked, not run)
	Naked                      // consumer: deliveries sent back with a delay
	DeadLettered               // consumer: messages dead-lettered (or rejected)
	Handled                    // consumer: effects completed and acked
	Unrecorded                 // consumer: effects done whose completion was not recorded
	Acks                       // acks sent to the broker
	Claims                     // guard: claims acquired
	ClaimErrors                // guard: claims that failed on the store
	Poisoned                   // handler calls that failed as poison
	Flaked                     // handler calls that failed once as flaky
	RelayClaimed               // gauge: outbox rows claimed by this relay and not yet settled
	RelayPublished             // outbox rows this relay published
	RelayErrors                // relay claim/settle/publish errors
	CrashPoint                 // the named crash point that killed this process (0: none)
	CrashHeld                  // InHandler when the crash point fired
	CrashUnsettled             // Unsettled when the crash point fired
	ClockOffset                // the fake clock offset in ms this worker runs with
	Ready                      // 1 once the worker consumes (or relays, or serves)
	HeldIdx                    // consumer: 1 + the index of a message a handler holds now (0: none known)
	NSlots
)

var names = [...]string{"pid", "alive", "fetched", "unsettled", "in_handler", "effects", "fenced", "reruns",
	"lease_lost", "store_errors", "duplicates", "naked", "dead_lettered", "handled", "unrecorded", "acks",
	"claims", "claim_errors", "poisoned", "flaked", "relay_claimed", "relay_published", "relay_errors",
	"crash_point", "crash_held", "crash_unsettled", "clock_offset_ms", "ready", "held_idx"}

func (s Slot) String() string {
	if s >= 0 && int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("slot%d", int(s))
}

const size = int(NSlots) * 8

// File is a mapped counter file.
type File struct {
	mem []byte
}

// Create makes (or truncates) path and maps it.
func Create(path string) (*File, error) { return open(path, true) }

// Open maps an existing counter file.
func Open(path string) (*File, error) { return open(path, false) }

func open(path string, create bool) (*File, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap %s: %w", path, err)
	}
	return &File{mem: mem}, nil
}

func (f *File) p(s Slot) *int64 { return (*int64)(unsafe.Pointer(&f.mem[int(s)*8])) }

// Add adds d to slot s and returns the new value.
func (f *File) Add(s Slot, d int64) int64 { return atomic.AddInt64(f.p(s), d) }

// Set stores v in slot s.
func (f *File) Set(s Slot, v int64) { atomic.StoreInt64(f.p(s), v) }

// CompareAndSwap sets slot s to new if it holds old.
func (f *File) CompareAndSwap(s Slot, old, new int64) bool {
	return atomic.CompareAndSwapInt64(f.p(s), old, new)
}

// Get reads slot s.
func (f *File) Get(s Slot) int64 { return atomic.LoadInt64(f.p(s)) }

// Snapshot reads every slot.
func (f *File) Snapshot() Values {
	var v Values
	for i := range v {
		v[i] = f.Get(Slot(i))
	}
	return v
}

// Close unmaps the file.
func (f *File) Close() error {
	if f.mem == nil {
		return nil
	}
	err := syscall.Munmap(f.mem)
	f.mem = nil
	return err
}

// Values is a snapshot of every counter.
type Values [NSlots]int64

// Sum adds the counters of several snapshots (gauges included).
func Sum(vs ...Values) Values {
	var out Values
	for _, v := range vs {
		for i := range v {
			out[i] += v[i]
		}
	}
	return out
}
