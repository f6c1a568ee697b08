// Command recording-cri serves a container runtime (CRI RuntimeService and
// ImageService) for a real kubelet on a machine with no container engine:
// the in-memory runtime of k8s.io/cri-client/pkg/fake, which pulls no image
// and runs nothing, plus a JSON line per PullImage, RunPodSandbox and
// CreateContainer request in -record ({"call", "at": Unix nanoseconds,
// "request"}), so that tests read what a container would really have been
// given (devices, environment, mounts, CDI devices, annotations) and when.
//
// On top of the in-memory runtime it reports the cgroupfs driver, an image
// size (kubelet refuses images of size 0: "Id or size of image ... is not
// set") and an image filesystem, and gives every container a real log file:
// the in-memory runtime leaves the log path empty, and kubelet's container
// cleanup then removes whatever "" + "*" matches in its working directory.
//
// A started container runs until kubelet stops it, except one whose
// environment sets RECORDING_CRI_EXIT_ON=<path>: it runs until that file
// exists, then exits 0 (state EXITED, reason Completed), which kubelet
// finds at its next relist. Tests hold an init container this way, so that
// kubelet has admitted the pod (and allocated its app containers' devices)
// but starts the app containers, and calls their device plugins'
// PreStartContainer, only when the test creates the file. A container whose
// name is in -exit-at-start exits 0 as soon as it is started: an init
// container that does its work and ends (the chart's hook installer), so
// that kubelet goes on to the pod's app containers.
//
// -pod-ip sets the address every pod sandbox reports (the in-memory
// runtime's FakePodSandboxIPs, 192.168.192.168 by default): kubelet probes a
// pod's HTTP readiness and liveness endpoints there, so a test that gives
// each node a loopback address of its own (127.0.0.N) and serves the probes
// there has kubelet judge a real process's answers.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// runtime is the in-memory runtime with its requests recorded.
type runtime struct {
	*fake.RemoteRuntime
	logDir string
	mu     sync.Mutex
	record *os.File
	// exitOn holds, by container ID, the RECORDING_CRI_EXIT_ON path of each
	// created container that set one, or "" for a container named in
	// exitAtStart (guarded by mu).
	exitOn map[string]string
	// exitAtStart names the containers that exit as soon as they start.
	exitAtStart map[string]bool
}

// exitOnEnv names the file whose existence ends a container (see above).
const exitOnEnv = "RECORDING_CRI_EXIT_ON"

// write appends one request, as {"call": ..., "request": ...}, to the record.
func (r *runtime) write(call string, req proto.Message) {
	body, err := protojson.Marshal(req)
	if err != nil {
		log.Printf("recording-cri: encoding %s: %v", call, err)
		return
	}
	at := strconv.FormatInt(time.Now().UnixNano(), 10)
	line := append([]byte(`{"call":"`+call+`","at":`+at+`,"request":`), body...)
	line = append(line, "}\n"...)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.record.Write(line); err != nil {
		log.Printf("recording-cri: writing the record: %v", err)
	}
}

// PullImage records the pull (kubelet pulls an image it does not have,
// after admission) and lets the in-memory image service "pull" it.
func (r *runtime) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	r.write("PullImage", req)
	return r.RemoteRuntime.PullImage(ctx, req)
}

func (r *runtime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	r.write("RunPodSandbox", req)
	return r.RemoteRuntime.RunPodSandbox(ctx, req)
}

func (r *runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	r.write("CreateContainer", req)
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(r.logDir, resp.ContainerId+".log")
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		f.Close()
	}
	s := r.RuntimeService
	s.Lock()
	if c, ok := s.Containers[resp.ContainerId]; ok {
		c.LogPath = path
	}
	s.Unlock()
	if r.exitAtStart[req.GetConfig().GetMetadata().GetName()] {
		r.mu.Lock()
		r.exitOn[resp.ContainerId] = ""
		r.mu.Unlock()
	}
	for _, env := range req.GetConfig().GetEnvs() {
		if value := strings.TrimSpace(string(env.GetValue())); env.GetKey() == exitOnEnv && value != "" {
			r.mu.Lock()
			r.exitOn[resp.ContainerId] = value
			r.mu.Unlock()
		}
	}
	return resp, nil
}

// StartContainer starts the container; one with RECORDING_CRI_EXIT_ON exits
// once its file exists.
func (r *runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	resp, err := r.RemoteRuntime.StartContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	path, ok := r.exitOn[req.ContainerId]
	r.mu.Unlock()
	if ok {
		go r.exitWhenExists(req.ContainerId, path)
	}
	return resp, nil
}

// exitWhenExists marks container id exited with code 0 once path exists
// (polled every 50 ms; at once when path is ""), unless it was removed or
// stopped before.
func (r *runtime) exitWhenExists(id, path string) {
	for path != "" {
		if _, err := os.Stat(path); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	s := r.RuntimeService
	s.Lock()
	defer s.Unlock()
	c, ok := s.Containers[id]
	if !ok || c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return
	}
	c.State = runtimeapi.ContainerState_CONTAINER_EXITED
	c.FinishedAt = time.Now().UnixNano()
	c.ExitCode = 0
	c.Reason = "Completed"
	if path == "" {
		log.Printf("recording-cri: container %s exited: it exits at start", id)
	} else {
		log.Printf("recording-cri: container %s exited: %s exists", id, path)
	}
}

func newRuntime(imageFs, logDir string, record *os.File, exitAtStart map[string]bool) *runtime {
	r := &runtime{
		RemoteRuntime: fake.NewFakeRemoteRuntime(),
		logDir:        logDir,
		record:        record,
		exitOn:        map[string]string{},
		exitAtStart:   exitAtStart,
	}
	r.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	fs := []*runtimeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: imageFs},
		UsedBytes:  &runtimeapi.UInt64Value{Value: 0},
		InodesUsed: &runtimeapi.UInt64Value{Value: 0},
	}}
	r.ImageService.FakeFilesystemUsage = fs
	r.ImageService.FakeContainerFilesystemUsage = fs
	r.ImageService.SetFakeImageSize(1 << 20)
	return r
}

func main() {
	endpoint := flag.String("endpoint", "", "the unix:// endpoint to serve")
	dir := flag.String("dir", "", "a scratch directory: image filesystem and container logs")
	recordPath := flag.String("record", "", "the file the requests are appended to")
	podIP := flag.String("pod-ip", "", "the IP address every pod sandbox reports (default: the in-memory runtime's)")
	exitAtStart := flag.String("exit-at-start", "", "comma-separated container names that exit 0 as soon as they start")
	flag.Parse()
	if *endpoint == "" || *dir == "" || *recordPath == "" {
		log.Fatal("recording-cri: -endpoint, -dir and -record are required")
	}
	if *podIP != "" {
		if net.ParseIP(*podIP) == nil {
			log.Fatalf("recording-cri: -pod-ip %q is not an IP address", *podIP)
		}
		apitest.FakePodSandboxIPs = []string{*podIP}
	}
	exiting := map[string]bool{}
	for _, name := range strings.Split(*exitAtStart, ",") {
		if name = strings.TrimSpace(name); name != "" {
			exiting[name] = true
		}
	}
	logDir := filepath.Join(*dir, "container-logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		log.Fatalf("recording-cri: %v", err)
	}
	record, err := os.OpenFile(*recordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatalf("recording-cri: opening the record %s: %v", *recordPath, err)
	}
	r := newRuntime(*dir, logDir, record, exiting)
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		log.Fatalf("recording-cri: listening on %s: %v", *endpoint, err)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, r)
	runtimeapi.RegisterImageServiceServer(server, r)
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Printf("recording-cri: %v", err)
		}
	}()
	log.Printf("recording-cri: serving on %s", *endpoint)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	server.Stop()
}
