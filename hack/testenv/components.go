package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// controlPlane supervises the Kubernetes components, each a child process
// running this same binary under the component's name (see main.go for why
// they cannot share one process).
type controlPlane struct {
	running []*component
	// exited is closed when the first component exits: any exit before
	// shutdown is a failure of the whole control plane.
	exited   chan struct{}
	exitOnce sync.Once
	// logMu keeps each log line whole when components write at once.
	logMu sync.Mutex
}

type component struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func newControlPlane() *controlPlane {
	return &controlPlane{exited: make(chan struct{})}
}

// start runs `<this binary> name args...`, its output prefixed with its name
// on our stderr so that one log shows the whole control plane.
func (cp *controlPlane) start(name string, args ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Stdout, cmd.Stderr = w, w
	// If testenv itself is killed outright, its children must not outlive it
	// and keep ports and CPU busy (Linux-only, like the rest of this tool).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c := &component{name: name, cmd: cmd, done: make(chan struct{})}
	cp.running = append(cp.running, c)
	go func() {
		cp.copyLog(name, r)
		c.err = cmd.Wait()
		close(c.done)
		cp.exitOnce.Do(func() { close(cp.exited) })
	}()
	return nil
}

func (cp *controlPlane) copyLog(name string, r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		cp.logMu.Lock()
		fmt.Fprintf(os.Stderr, "[%s] %s\n", name, sc.Bytes())
		cp.logMu.Unlock()
	}
}

// failure says which component has exited, if any.
func (cp *controlPlane) failure() error {
	for _, c := range cp.running {
		select {
		case <-c.done:
			return fmt.Errorf("%s exited (%v); its log above says why", c.name, c.err)
		default:
		}
	}
	return nil
}

// stop terminates the components in reverse start order, so that the
// apiserver is the last to go and the others can release their leases.
func (cp *controlPlane) stop(grace time.Duration) {
	for i := len(cp.running) - 1; i >= 0; i-- {
		c := cp.running[i]
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(grace):
			fmt.Fprintf(os.Stderr, "testenv: %s still running %s after SIGTERM, killing it\n", c.name, grace)
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
}

func apiserverFlags(p *pki, etcdURL string, port int) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + p.path("apiserver-certs"),
		"--tls-cert-file=" + p.path(servingCertFile),
		"--tls-private-key-file=" + p.path(servingKeyFile),
		"--client-ca-file=" + p.path(caCertFile),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-signing-key-file=" + p.path(saKeyFile),
		"--service-account-key-file=" + p.path(saKeyFile),
		"--service-cluster-ip-range=" + serviceCIDR,
		"--authorization-mode=Node,RBAC",
		// An Endpoints object may not hold a loopback address, so the
		// `kubernetes` Service cannot point at us; nothing runs in-cluster
		// that would need it.
		"--endpoint-reconciler-type=none",
	}
}

// controllerManagerFlags, like schedulerFlags, turns secure serving off
// (port 0): nothing scrapes these two, and two fewer ports means two fewer
// chances to collide with a parallel test session.
func controllerManagerFlags(p *pki, kubeconfig string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--secure-port=0",
		"--leader-elect=true",
		// Each controller acts under its own ServiceAccount, as in a
		// production cluster, so RBAC is exercised for them too.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p.path(saKeyFile),
		"--root-ca-file=" + p.path(caCertFile),
		"--cluster-signing-cert-file=" + p.path(caCertFile),
		"--cluster-signing-key-file=" + p.path(caKeyFile),
		// Its default is under /usr/libexec, which it would create on the host.
		"--flex-volume-plugin-dir=" + p.path("flexvolume"),
	}
}

func schedulerFlags(kubeconfig string) []string {
	return []string{"--kubeconfig=" + kubeconfig, "--secure-port=0", "--leader-elect=true"}
}
