package ibvtest

import "github.com/pegaflow/pegad/internal/ibv"

// FailConnect wraps a device so that its QPs' Connect fails while Fail
// returns an error, as rxe's ibv_modify_qp to RTR does once its netdev has
// no route to the peer (`ip link set veth3 down` in verbs-e2e phase 5).
// Only this side's QPs fail: a peer opening the same device connects as
// usual. Port state and events are the wrapped device's, so the wrapper
// models a route fault, not a port fault.
type FailConnect struct {
	ibv.Device
	// Err, when it returns non-nil, is what Connect returns for the QP
	// numbered qpn; the caller builds its provider's error type.
	Err func(qpn uint32) error
}

// PortActive is the wrapped device's (ibv.PortStater).
func (d FailConnect) PortActive() (bool, error) { return d.Device.(ibv.PortStater).PortActive() }

// Events are the wrapped device's (ibv.EventDevice).
func (d FailConnect) Events() <-chan ibv.DeviceEvent { return d.Device.(ibv.EventDevice).Events() }

// AllocPD allocates on the wrapped device; the PD's QPs fail to connect
// while Err says so.
func (d FailConnect) AllocPD() (ibv.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return failPD{PD: pd, d: d}, nil
}

type failPD struct {
	ibv.PD
	d FailConnect
}

func (p failPD) CreateQP(cq ibv.CQ, c ibv.QPCap) (ibv.QP, error) {
	qp, err := p.PD.CreateQP(cq, c)
	if err != nil {
		return nil, err
	}
	return failQP{QP: qp, d: p.d}, nil
}

type failQP struct {
	ibv.QP
	d FailConnect
}

func (q failQP) Connect(remote ibv.Endpoint, attr ibv.ConnectAttr) error {
	if err := q.d.Err(q.QPN()); err != nil {
		return err
	}
	return q.QP.Connect(remote, attr)
}
