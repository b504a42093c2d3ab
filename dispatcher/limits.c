/* limits.c: the per-type limits of the loop (docs/taskpushd.md, "Per-type limits"): the
 * table by type name, filled from --type-limit and changed by POST /limit, and handed to
 * each type when it is interned, since a type is freed and made again as workers come
 * and go. The enforcement itself is dispatch.c's. Runs on the loop thread. */
#include "dispatch.h"
#include "utf8.h"
#include "proto.h"
#include "server.h"

#include <stdlib.h>
#include <string.h>

int dsp_limits_init(dsp_server *srv)
{
    const dsp_config *cfg = srv->cfg;
    if (cfg->ntype_limits == 0)
        return 0;
    srv->limits.items = calloc(cfg->ntype_limits, sizeof *srv->limits.items);
    if (!srv->limits.items)
        return -1;
    for (size_t i = 0; i < cfg->ntype_limits; i++) {
        srv->limits.items[i] = cfg->type_limits[i];
        if (!(srv->limits.items[i].type = strdup(cfg->type_limits[i].type)))
            return -1; /* dsp_limits_free frees what was copied */
        srv->limits.n++;
    }
    return 0;
}

void dsp_limits_free(dsp_server *srv)
{
    for (size_t i = 0; i < srv->limits.n; i++)
        free(srv->limits.items[i].type);
    free(srv->limits.items);
    srv->limits.items = NULL;
    srv->limits.n = 0;
}

/* A linear search: at most --max-types entries, and only on interning a type or on an
 * operator's request, never per task. */
const dsp_type_limit *dsp_limits_find(const dsp_server *srv, const char *type)
{
    for (size_t i = 0; i < srv->limits.n; i++)
        if (strcmp(srv->limits.items[i].type, type) == 0)
            return &srv->limits.items[i];
    return NULL;
}

void dsp_limits_apply(const dsp_server *srv, dsp_type *ty)
{
    const dsp_type_limit *l = srv->limits.n ? dsp_limits_find(srv, ty->name) : NULL;
    ty->max_running = l ? l->concurrency : 0;
    ty->max_rate = l ? l->rate : 0;
    ty->bucket = (dsp_bucket){0};
    dsp_groups_set(ty, l ? l->per_group : 0);
}

const char *dsp_limits_set(dsp_server *srv, const char *type, uint32_t concurrency, uint32_t rate,
                           uint32_t per_group, enum dsp_limit_source source)
{
    size_t len = strlen(type);
    if (len == 0 || len > PROTO_MAX_TYPE_LEN || dsp_utf8_valid_prefix((const uint8_t *)type, len) != len)
        return "a task type must be 1 to 256 bytes of UTF-8";
    dsp_type_limit *l = (dsp_type_limit *)dsp_limits_find(srv, type);
    if (!l && (concurrency || rate || per_group)) {
        if ((int64_t)srv->limits.n >= srv->cfg->max_types)
            return "too many types with limits (--max-types)";
        dsp_type_limit *a = realloc(srv->limits.items, (srv->limits.n + 1) * sizeof *a);
        if (!a)
            return "out of memory";
        srv->limits.items = a;
        char *name = strdup(type);
        if (!name)
            return "out of memory";
        l = &a[srv->limits.n++];
        *l = (dsp_type_limit){.type = name};
    }
    if (l && !concurrency && !rate && !per_group) { /* no limit left: the entry goes */
        free(l->type);
        *l = srv->limits.items[--srv->limits.n];
        l = NULL;
    } else if (l) {
        l->concurrency = concurrency;
        l->rate = rate;
        l->per_group = per_group;
        l->source = source;
    }
    dsp_type *ty = dsp_server_type_find(srv, (const uint8_t *)type, strlen(type));
    if (ty) {
        bool rate_changed = ty->max_rate != rate;
        ty->max_running = concurrency;
        ty->max_rate = rate;
        if (rate_changed) /* the new rate starts with a full second's worth */
            ty->bucket = (dsp_bucket){0};
        dsp_groups_set(ty, per_group);
    }
    log_info(&srv->log, "type %s: concurrency limit %u, rate limit %u/s, per group_key %u (0: none)", type,
             concurrency, rate, per_group);
    dsp_server_kick(srv); /* a raised limit lets buffered tasks go */
    return NULL;
}

void dsp_settings_apply(dsp_server *srv, const dsp_setting *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const dsp_setting *s = &v[i];
        const char *why = NULL;
        if (s->type[0] == '\0') { /* every type: only a pause */
            if (s->paused)
                why = dsp_server_pause(srv, NULL);
        } else {
            if (s->has_limit)
                why = dsp_limits_set(srv, s->type, s->concurrency, s->rate, s->per_group,
                                     DSP_LIMIT_RUNTIME);
            if (!why && s->paused)
                why = dsp_server_pause(srv, s->type);
        }
        if (why)
            log_warn(&srv->log, "runtime setting of type %s not applied: %s",
                     s->type[0] ? s->type : "(every type)", why);
    }
    log_info(&srv->log, "runtime settings: %zu row(s) of the table applied", n);
}
