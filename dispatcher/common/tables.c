/* tables: see tables.h. */
#include "tables.h"

#include <stdio.h>
#include <string.h>

const dsp_table_names dsp_table_names_task = {
    .task = "task",
    .meta = "taskpush_meta",
    .schedule = "task_schedule",
    .claim = "task_claim",
    .setting = "task_setting",
    .progress = "task_progress",
    .dep = "task_dep",
    .is_default = true,
};

const char *const dsp_table_constraint_names[] = {
    /* task */
    "task_type_no_trailing_space", "task_priority_range", "task_state_range", "attempts_min",
    "max_attempts_range", "timeout_ms_positive", "run_after_min", "task_type_not_empty",
    "attempts_max",
    /* task_schedule */
    "schedule_name_not_empty", "schedule_type_valid", "schedule_priority_range",
    "schedule_one_rule", "schedule_interval_range", "schedule_missed_rule",
    "schedule_catch_up_max_range", "schedule_next_run_min",
    /* task_claim */
    "task_claim_ids_not_empty",
    /* task_setting */
    "setting_limits_range", "setting_flags_range",
    /* task_progress */
    "progress_permille_range",
    /* task_dep */
    "dep_not_self", NULL};

_Static_assert(DSP_TABLE_NAME_MAX + 1 + DSP_TABLE_CONSTRAINT_MAX <= 64,
               "NAME_<constraint> must fit MySQL's 64-byte identifiers");

static bool is_alpha_(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static bool is_word(char c)
{
    /* '$' is an identifier character in MySQL, and bytes >= 0x80 may be (UTF-8): a
     * name next to one is part of a longer identifier, not ours. */
    return is_alpha_(c) || (c >= '0' && c <= '9') || c == '$' || (unsigned char)c >= 0x80;
}

bool dsp_table_name_valid(const char *s, size_t len)
{
    if (s == NULL || len == 0 || len > DSP_TABLE_NAME_MAX || !is_alpha_(s[0]))
        return false;
    for (size_t i = 1; i < len; i++)
        if (!is_alpha_(s[i]) && !(s[i] >= '0' && s[i] <= '9'))
            return false;
    return true;
}

int dsp_table_names_init(dsp_table_names *t, const char *name)
{
    if (name == NULL || !dsp_table_name_valid(name, strlen(name)))
        return -1;
    if (strcmp(name, DSP_TABLE_NAME_DEFAULT) == 0) {
        *t = dsp_table_names_task;
        return 0;
    }
    memset(t, 0, sizeof *t);
    snprintf(t->task, sizeof t->task, "%s", name);
    snprintf(t->meta, sizeof t->meta, "%s_meta", name);
    snprintf(t->schedule, sizeof t->schedule, "%s_schedule", name);
    snprintf(t->claim, sizeof t->claim, "%s_claim", name);
    snprintf(t->setting, sizeof t->setting, "%s_setting", name);
    snprintf(t->progress, sizeof t->progress, "%s_progress", name);
    snprintf(t->dep, sizeof t->dep, "%s_dep", name);
    return 0;
}

void dsp_table_names_subst(dsp_strbuf *out, const dsp_table_names *t, const char *text, size_t len)
{
    const dsp_table_names *d = &dsp_table_names_task;
    const char *from[] = {d->task, d->meta, d->schedule, d->claim, d->setting, d->progress, d->dep};
    const char *to[] = {t->task, t->meta, t->schedule, t->claim, t->setting, t->progress, t->dep};
    _Static_assert(sizeof from == sizeof to, "each default name has its replacement");
    size_t i = 0, copied = 0;

    if (t->is_default) {
        dsp_strbuf_put(out, text, len);
        return;
    }
    while (i < len) {
        size_t w = i;
        if (!is_word(text[i])) {
            i++;
            continue;
        }
        while (i < len && is_word(text[i]))
            i++;
        bool done = false;
        for (size_t k = 0; k < sizeof from / sizeof from[0] && !done; k++) {
            size_t n = strlen(from[k]);
            if (i - w == n && memcmp(text + w, from[k], n) == 0) {
                dsp_strbuf_put(out, text + copied, w - copied);
                dsp_strbuf_puts(out, to[k]);
                copied = i;
                done = true;
            }
        }
        for (const char *const *c = dsp_table_constraint_names; *c && !done; c++) {
            size_t n = strlen(*c);
            if (i - w == n && memcmp(text + w, *c, n) == 0) {
                dsp_strbuf_put(out, text + copied, w - copied);
                dsp_strbuf_printf(out, "%s_%s", t->task, *c);
                copied = i;
                done = true;
            }
        }
    }
    dsp_strbuf_put(out, text + copied, len - copied);
}
