package taskpush

import (
	"container/list"

	"taskpush.dev/taskpush/wire"
)

// outcomeLimit is how many unconfirmed outcomes a worker of this capacity
// keeps (as libtaskpush): a dispatcher that commits in batches leaves a few
// capacities' worth waiting, and 1024 more cover a failover's backlog.
func outcomeLimit(capacity int) int { return 4*capacity + 1024 }

// outcomes are the DONEs sent (or to be sent) and not yet confirmed, oldest
// first (protocol version 3). Not safe for concurrent use: the Worker holds
// its lock.
type outcomes struct {
	limit   int
	order   *list.List // of *wire.Done
	byKey   map[wire.Delivery]*list.Element
	evicted int
}

func newOutcomes(limit int) *outcomes {
	return &outcomes{limit: limit, order: list.New(), byKey: make(map[wire.Delivery]*list.Element)}
}

func (o *outcomes) len() int { return o.order.Len() }

// keep adds d; past the limit the oldest is forgotten and returned.
func (o *outcomes) keep(d *wire.Done) *wire.Done {
	if e, ok := o.byKey[d.Delivery]; ok {
		o.order.Remove(e)
	}
	o.byKey[d.Delivery] = o.order.PushBack(d)
	if o.order.Len() <= o.limit {
		return nil
	}
	old := o.order.Remove(o.order.Front()).(*wire.Done)
	delete(o.byKey, old.Delivery)
	o.evicted++
	return old
}

// confirm forgets the confirmed ones; returns how many were kept.
func (o *outcomes) confirm(keys []wire.Delivery) int {
	n := 0
	for _, k := range keys {
		if e, ok := o.byKey[k]; ok {
			o.order.Remove(e)
			delete(o.byKey, k)
			n++
		}
	}
	return n
}

func (o *outcomes) pending() []*wire.Done {
	out := make([]*wire.Done, 0, o.order.Len())
	for e := o.order.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(*wire.Done))
	}
	return out
}

func (o *outcomes) clear() {
	o.order.Init()
	o.byKey = make(map[wire.Delivery]*list.Element)
}

// holdingFrames declares keys in frames of at most MaxConfirm entries.
func holdingFrames(keys []wire.Delivery) []*wire.Holding {
	var out []*wire.Holding
	for len(keys) > 0 {
		n := len(keys)
		if n > wire.MaxConfirm {
			n = wire.MaxConfirm
		}
		out = append(out, &wire.Holding{Deliveries: keys[:n]})
		keys = keys[n:]
	}
	return out
}
