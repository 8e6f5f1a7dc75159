package verbs

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/pegaflow/pegad/internal/ibv"
)

// Error is a failed verbs call: the call, its errno, and the ibv sentinel
// callers branch on (nil when none fits). errors.Is matches both the
// sentinel and the errno.
type Error struct {
	Op    string // the verbs call, e.g. "ibv_reg_mr"
	Errno syscall.Errno
	Kind  error  // an ibv sentinel, or nil
	Hint  string // what an operator should check; may be empty
}

func (e *Error) Error() string {
	s := e.Op + ": " + e.Errno.Error()
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// Unwrap exposes the sentinel and the errno to errors.Is.
func (e *Error) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Errno}
	}
	return []error{e.Kind, e.Errno}
}

// errnoRule maps an errno of one verbs call ("" for any call) to a sentinel
// and an operator hint.
type errnoRule struct {
	op    string
	errno syscall.Errno
	kind  error
	hint  string
}

const memlockHint = "memory registration pins pages: raise RLIMIT_MEMLOCK (systemd LimitMEMLOCK=infinity)"

// errnoRules is searched in order: call-specific rules first, then the
// generic ones (op "").
var errnoRules = []errnoRule{
	{"ibv_get_device_list", syscall.ENOSYS, ibv.ErrUnavailable, "no RDMA kernel support"},
	{"ibv_get_device_list", syscall.ENODEV, ibv.ErrUnavailable, "no RDMA devices"},
	{"ibv_get_device_list", syscall.ENOENT, ibv.ErrUnavailable, "no RDMA devices"},
	{"ibv_get_device_list", syscall.EPERM, ibv.ErrUnavailable, "no permission to use RDMA devices"},
	{"ibv_get_device_list", syscall.EACCES, ibv.ErrUnavailable, "no permission to use RDMA devices"},
	{"ibv_open_device", syscall.ENODEV, ibv.ErrNoDevice, "device removed"},
	{"ibv_open_device", syscall.ENOENT, ibv.ErrNoDevice, "device removed"},
	{"ibv_open_device", syscall.EPERM, ibv.ErrUnavailable, "no permission on /dev/infiniband/uverbs*"},
	{"ibv_open_device", syscall.EACCES, ibv.ErrUnavailable, "no permission on /dev/infiniband/uverbs*"},
	{"ibv_reg_mr", syscall.ENOMEM, nil, memlockHint},
	{"ibv_reg_mr", syscall.EPERM, nil, memlockHint},
	{"ibv_reg_mr", syscall.EAGAIN, nil, memlockHint},
	{"ibv_reg_mr", syscall.EFAULT, ibv.ErrInvalidArgument, "memory not mapped or not suitable for registration"},
	{"ibv_post_send", syscall.ENOMEM, ibv.ErrQueueFull, ""},
	{"ibv_create_qp", syscall.ENOMEM, nil, "too many QPs or queue depth above the device limit"},
	{"ibv_create_cq", syscall.ENOMEM, nil, "too many CQs or depth above the device limit"},
	{"", syscall.EINVAL, ibv.ErrInvalidArgument, ""},
	{"", syscall.EBUSY, ibv.ErrInvalidState, "still in use"},
	{"", syscall.ENOSYS, ibv.ErrUnavailable, "not supported by this device or kernel"},
	{"", syscall.EOPNOTSUPP, ibv.ErrUnavailable, "not supported by this device or kernel"},
	{"", syscall.ENODEV, ibv.ErrNoDevice, "device removed"},
}

// verbsErr turns the errno of a failed verbs call into an *Error. An errno
// of 0 (a call that failed without setting errno) reads as EIO.
func verbsErr(op string, errno syscall.Errno) error {
	if errno == 0 {
		errno = syscall.EIO
	}
	e := &Error{Op: op, Errno: errno}
	for _, r := range errnoRules {
		if r.errno == errno && (r.op == op || r.op == "") {
			e.Kind, e.Hint = r.kind, r.hint
			break
		}
	}
	return e
}

// pollErr reports a negative ibv_poll_cq return. ibv_poll_cq(3) says only
// "a negative value" (mlx5 returns -2, CQ_POLL_ERR): it is not an errno,
// so it reads as EIO with the value in the message.
func pollErr(r int) error {
	return &Error{Op: "ibv_poll_cq", Errno: syscall.EIO,
		Hint: fmt.Sprintf("returned %d: the CQ is unusable (overrun, or a CQE the provider cannot parse)", r)}
}

// unavailableError says why the verbs provider cannot run on this host.
type unavailableError struct {
	reason string
	cause  error // may be nil
}

func (e *unavailableError) Error() string { return "verbs unavailable: " + e.reason }

func (e *unavailableError) Unwrap() []error {
	if e.cause == nil {
		return []error{ibv.ErrUnavailable}
	}
	return []error{ibv.ErrUnavailable, e.cause}
}

func unavailable(reason string, cause error) error {
	return &unavailableError{reason: reason, cause: cause}
}

// errUnavailableReason returns the one-line reason carried by err.
func errUnavailableReason(err error) string {
	var u *unavailableError
	if errors.As(err, &u) {
		return u.Error()
	}
	return err.Error()
}
