/* conn.h: one worker connection: framing, the HELLO handshake, heartbeats,
 * and the frames of the task protocol (proto/PROTOCOL.md).
 *
 * States (every change goes through conn_set_state in conn.c):
 *   WANT_HELLO -> ACTIVE -> CLOSING -> freed
 *   WANT_HELLO -> CLOSING (bad hello, version, token)
 * In CLOSING nothing is read; the output (an ERROR frame, say) drains, then
 * the connection is freed. */
#ifndef TASKPUSH_DSP_CONN_H
#define TASKPUSH_DSP_CONN_H

#include "dispatch.h"
#include "frame_stage.h"
#include "proto.h"
#include "server.h"

#include <stdbool.h>
#include <stdint.h>

struct bufferevent;
struct sockaddr;

enum dsp_conn_state {
    DSP_CONN_WANT_HELLO = 0, /* accepted; the first frame must be HELLO */
    DSP_CONN_ACTIVE,         /* welcomed: tasks flow while slots.accepting */
    DSP_CONN_CLOSING,        /* flushing its last output, then freed */
};
#define DSP_CONN_NSTATES 3
/* If you add a state, add its name to state_names in conn.c. */
const char *dsp_conn_state_text(int state);

/* A cancelled delivery whose slot stays taken until the worker answers it. */
typedef struct dsp_zombie {
    uint64_t task_id;
    uint32_t attempt;
    struct dsp_zombie *next;
} dsp_zombie;

/* A delivery a worker declared (HOLDING, version 3) whose ADOPT the write thread has not
 * answered yet; it holds one of the connection's slots meanwhile (inventory.c). */
typedef struct dsp_adopting {
    uint64_t task_id;
    uint32_t epoch, attempt;
    bool done;                /* its DONE came before the answer: applied once adopted */
    uint8_t outcome;
    uint32_t retry_after_ms;
    size_t len;
    uint8_t *data;
} dsp_adopting;

struct dsp_conn {
    dsp_sched_slots slots; /* what the scheduler sees */
    dsp_server *srv;
    struct bufferevent *bev;
    struct event *free_ev;  /* frees the connection once CLOSING has flushed */
    int state;
    uint64_t id;
    char addr[64];
    char *name;             /* from HELLO */
    dsp_type **types;       /* from HELLO */
    size_t ntypes;
    dsp_task *inflight;     /* current deliveries */
    dsp_zombie *zombies;
    int64_t connected_ms, last_rx_ms, last_tx_ms;
    uint64_t completed_total;
    uint64_t delivered_total;
    uint32_t timeouts_in_row;  /* lease expiries since its last DONE (--max-timeouts) */
    bool refund;               /* on close, its deliveries are taken back uncharged */
    bool welcomed;             /* its HELLO was accepted (else its end is a failed handshake) */
    int64_t frame_started_ms;  /* when the bytes now waiting in the input began, or the last
                                * whole frame after them: a half frame must complete in time */
    int64_t out_progress_ms;   /* the output was last empty or drained by the peer then */
    int64_t out_over_ms;       /* the output went over --max-conn-output-bytes then (0: under) */
    bool direct_write;         /* plaintext: conn.c writes the socket itself (conn_flush) */
    struct event *read_ev;     /* plaintext: its socket readable; conn.c reads it itself */
    size_t read_high;          /* input buffered beyond which reading stops */
    bool read_suspended;       /* read_ev is off until the input drops under read_high */
    bool flush_queued;         /* on the server's flush list */
    dsp_conn *flush_next;
    proto_frame_stage stage;   /* plaintext: this pass's frames, sent at its flush */
    uint16_t version;          /* the protocol version of its HELLO (1 .. 3) */
    dsp_adopting *adopting;    /* declared deliveries waiting for the write thread */
    uint32_t nadopting, adopting_cap;
    proto_dlv *confirms;       /* settled deliveries whose CONFIRM waits (inventory.c) */
    uint32_t nconfirms, confirms_cap;
    bool confirm_queued;       /* on the server's confirm list */
    dsp_conn *confirm_next;
    /* Submissions (conn_submit.c): queued for the database, not yet answered. */
    uint32_t submits_pending;
    uint64_t submit_bytes_pending;
    uint64_t wait_reserved;    /* tasks of pending WAIT submissions */
    uint64_t waiting;          /* inserted tasks whose OUTCOME is still to come */
    bool submit_paused;        /* reading stopped until answers bring it under the bounds */
    uint64_t submit_reserved;  /* bytes of the SUBMIT frame being read, in the server's budget */
    bool budget_wait;          /* not read until the server's submission budget has room */
    dsp_conn *prev, *next;  /* the server's list */
};

/* Takes ownership of fd. */
void dsp_conn_accept(dsp_server *srv, int fd, const struct sockaddr *sa, int salen);

/* Writes the TASK frame of t's delivery to c, which dispatch.c has just recorded
 * (attempt, epoch, in-flight list, slot, lease). */
void dsp_conn_send_task(dsp_conn *c, const dsp_task *t, int64_t now_ms);

/* Sends CANCEL for t's current delivery and keeps its slot taken until the
 * worker answers; t is unlinked from c. */
void dsp_conn_cancel(dsp_conn *c, dsp_task *t);

/* Sends a frame with no fields (HEARTBEAT, STOP). */
void dsp_conn_send_simple(dsp_conn *c, uint8_t type);

/* Whether a frame of n bytes may join c's output: beyond twice --max-conn-output-bytes
 * (after writing what the socket takes now) c is closed as stalled and false returned;
 * beyond once, for 3 heartbeats, dsp_conn_tick closes it. */
bool dsp_conn_output_room(dsp_conn *c, size_t n);
/* Writes a whole frame of any size (SUBMITTED, OUTCOME, CONFIRM, CANCEL) to c, when
 * dsp_conn_output_room lets it. */
void dsp_conn_send_frame(dsp_conn *c, const proto_msg *m);
/* Sends the CONFIRMs waiting for c now (version 3; they ride in the write its other
 * frames make), as many CONFIRM frames as PROTO_MAX_CONFIRM needs. inventory.c decides
 * when; a connection no longer ACTIVE drops them. */
void dsp_conn_send_confirms(dsp_conn *c);

/* Sends ERROR (when code != 0), stops reading, hands the worker's deliveries
 * back to the server, and frees c once the output is flushed. */
void dsp_conn_close(dsp_conn *c, uint16_t code, const char *why);

/* Heartbeats, silence, half frames and unread output: called by the housekeeping timer. */
void dsp_conn_tick(dsp_conn *c, int64_t now_ms);

/* A delivery of c timed out (the caller cancels it): after --max-timeouts in a row the
 * worker is dropped and its other deliveries are taken back uncharged. Returns true
 * when c is closing. */
bool dsp_conn_note_timeout(dsp_conn *c);

/* Room for a frame of n bytes at the end of c's output, in its stage: the caller writes
 * the frame there and adds n to c->stage.len. NULL when the frame goes to the
 * bufferevent's output instead (TLS, a large frame, no memory); whatever the stage held
 * was moved there first, so frames keep their order. */
uint8_t *dsp_conn_stage_reserve(dsp_conn *c, size_t n);

/* Output was added to c's stage or bufferevent: a plaintext connection writes it in this
 * loop pass (flush_ev). Everything that adds output must call it. */
void dsp_conn_output_added(dsp_conn *c);

/* The server's flush_ev: writes every connection given output in this loop pass. */
void dsp_conn_flush_cb(evutil_socket_t fd, short what, void *arg);
/* ---- submissions (conn_submit.c) ---- */

/* What one connection may have waiting for the database: beyond either bound the
 * dispatcher stops reading it until answers come back (docs/taskpushd.md). */
#define DSP_SUBMIT_CONN_MAX_PENDING 16
#define DSP_SUBMIT_CONN_MAX_BYTES ((uint64_t)32 * 1024 * 1024)
/* Most tasks one connection may wait for (WAIT) at once; beyond, UNAVAILABLE. */
#define DSP_SUBMIT_CONN_MAX_WAITING 100000

struct proto_submit;
/* A SUBMIT frame of c (body: the frame's body, borrowed): checks every task, answers
 * INVALID or UNAVAILABLE at once, or hands a copy to the submit thread. */
void dsp_conn_submit(dsp_conn *c, const struct proto_submit *s, const uint8_t *body, size_t len);
/* The server's submission budget (--max-submit-bytes) has room again: connections that
 * waited for it are read again. */
void dsp_conn_submit_budget_freed(dsp_server *srv);
/* c closes: its waited-for tasks are forgotten (the answers still due are dropped). */
void dsp_conn_submit_closed(dsp_conn *c);
/* The database's callbacks (server.c wires them). */
void dsp_conn_on_submitted(void *arg, dsp_submit_req *req);
void dsp_conn_on_outcome(void *arg, const dsp_submit_outcome *o);
/* Why a task type cannot name rows of the table, or NULL (conn.c). */
const char *dsp_conn_type_problem(const uint8_t *type, size_t len);

/* ---- the inventory, protocol version 3 (inventory.c) ---- */

/* A HOLDING frame of c: each delivery is queued for adoption, or refused with CANCEL. */
void dsp_inv_holding(dsp_conn *c, const proto_dlv_list *l);
/* A DONE of c for a delivery it does not hold (zombie: it was a cancelled delivery of c):
 * stashed while its adoption is pending, else (version 3) written fenced by its own
 * delivery, or only confirmed. */
void dsp_inv_done(dsp_conn *c, const proto_done *d, bool zombie);
/* o (just added to the outbox for c's DONE of the delivery epoch/attempt) is confirmed to
 * c once written, when c speaks version 3. */
void dsp_inv_confirm_later(dsp_conn *c, dsp_outcome *o, uint32_t epoch, uint32_t attempt);
/* A write report with acks: CONFIRM frames, adoptions answered. */
void dsp_inv_on_written(dsp_server *srv, const dsp_write_report *r);
/* The server's confirm_ev: sends the CONFIRMs that waited their longest. */
void dsp_inv_confirm_cb(evutil_socket_t fd, short what, void *arg);
/* c was welcomed (version 3: CONFIRMs find it by id) / is freed. */
void dsp_inv_conn_joined(dsp_conn *c);
void dsp_inv_conn_freed(dsp_conn *c);

/* Frees at once, without flushing (shutdown). */
void dsp_conn_free(dsp_conn *c);

#endif
