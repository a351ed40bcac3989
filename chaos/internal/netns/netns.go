// Package netns gives the harness's worker processes a network namespace of
// their own, joined to the host by two veth pairs: one to the broker (and
// the ledger), one to the store. Cutting the store pair (its host end set
// down) partitions the workers from the store and nothing else: packets
// are dropped, open connections hang, new ones get "no route to host".
// It needs root and iproute2 (ip netns, ip link); no iptables or tc.
package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// NS is a namespace with its two links.
type NS struct {
	Name       string
	BrokerHost string // host end of the broker link, as the workers reach it
	StoreHost  string // host end of the store link
	brokerIf   string
	storeIf    string
	down       bool
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Available reports why namespaces cannot be made here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("iproute2 (ip) not found")
	}
	return nil
}

// Create makes namespace idemchaos-<pid> with subnets derived from the pid
// (moving on when an address is taken).
func Create() (*NS, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	pid := os.Getpid()
	name := "idemchaos-" + strconv.Itoa(pid)
	_ = ip("netns", "del", name) // a leftover of a previous process with our pid
	out, _ := exec.Command("ip", "-o", "addr").Output()
	var a, b int
	for k := 0; ; k++ {
		if k == 200 {
			return nil, errors.New("netns: no free 10.x.y.0/29 subnet")
		}
		a, b = 200+(pid/250+k)%50, (pid+k)%250
		if !strings.Contains(string(out), fmt.Sprintf(" 10.%d.%d.", a, b)) {
			break
		}
	}
	tag := strconv.FormatInt(int64(pid), 36)
	ns := &NS{Name: name, brokerIf: "icb" + tag, storeIf: "ics" + tag,
		BrokerHost: fmt.Sprintf("10.%d.%d.1", a, b), StoreHost: fmt.Sprintf("10.%d.%d.5", a, b)}
	steps := [][]string{
		{"netns", "add", name},
		{"-n", name, "link", "set", "lo", "up"},
		{"link", "add", ns.brokerIf, "type", "veth", "peer", "name", ns.brokerIf + "n"},
		{"link", "set", ns.brokerIf + "n", "netns", name},
		{"addr", "add", ns.BrokerHost + "/30", "dev", ns.brokerIf},
		{"link", "set", ns.brokerIf, "up"},
		{"-n", name, "addr", "add", fmt.Sprintf("10.%d.%d.2/30", a, b), "dev", ns.brokerIf + "n"},
		{"-n", name, "link", "set", ns.brokerIf + "n", "up"},
		{"link", "add", ns.storeIf, "type", "veth", "peer", "name", ns.storeIf + "n"},
		{"link", "set", ns.storeIf + "n", "netns", name},
		{"addr", "add", ns.StoreHost + "/30", "dev", ns.storeIf},
		{"link", "set", ns.storeIf, "up"},
		{"-n", name, "addr", "add", fmt.Sprintf("10.%d.%d.6/30", a, b), "dev", ns.storeIf + "n"},
		{"-n", name, "link", "set", ns.storeIf + "n", "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			ns.Delete()
			return nil, err
		}
	}
	return ns, nil
}

// Command returns argv that runs argv inside the namespace.
func (n *NS) Command(argv ...string) []string {
	return append([]string{"ip", "netns", "exec", n.Name}, argv...)
}

// Partition cuts (true) or heals (false) the store link.
func (n *NS) Partition(cut bool) error {
	state := "up"
	if cut {
		state = "down"
	}
	if err := ip("link", "set", n.storeIf, state); err != nil {
		return err
	}
	n.down = cut
	return nil
}

// Partitioned reports whether the store link is cut.
func (n *NS) Partitioned() bool { return n.down }

// Delete removes the namespace; its veth pairs go with it.
func (n *NS) Delete() error {
	var errs []error
	if err := ip("netns", "del", n.Name); err != nil {
		errs = append(errs, err)
	}
	for _, i := range []string{n.brokerIf, n.storeIf} {
		if exec.Command("ip", "link", "show", i).Run() == nil {
			// The kernel removes the pair on its own once the namespace
			// holding its peer is gone, possibly between the show and
			// the del: a device already gone is what Delete wants.
			if err := ip("link", "del", i); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Sweep deletes namespaces idemchaos-<pid> whose process is gone (left by a
// harness that was killed before it could clean up).
func Sweep() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "idemchaos-") {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimPrefix(f[0], "idemchaos-"))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			continue
		}
		_ = ip("netns", "del", f[0])
	}
}
