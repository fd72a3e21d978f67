/* The host's side of the persistent scheduler (persistent_protocol.h), as C functions the
 * executor calls (persistent_host.py): the state's layout, publishing a task, closing and
 * stopping the run, and the acquire loads of the words the blocks show it. persistent_host.py
 * builds it with the protocol's text pasted above, so the two are one translation unit and one
 * hash. */

unsigned long long pto_persistent_sched_bytes(void) { return sizeof(pto_sched); }

/* Lay out a scheduler in the two regions (pto_layout); bytes[0], bytes[1]: their sizes. The
 * executor keeps the producers the last `slots` tasks name within the ring of `words`: the
 * successor pool is sized by that bound. */
void pto_persistent_layout(pto_sched *s, pto_u32 slots, pto_u32 words, pto_u32 record_words, char *device,
                           char *mapped, pto_u64 bytes[2]) {
    const pto_extent extent = pto_layout(s, slots, words, pto_pool_chunks(slots, words), record_words, device,
                                         mapped);
    bytes[0] = extent.device_bytes;
    bytes[1] = extent.mapped_bytes;
}

/* Where the task records are (the executor writes each one's words past the header), the
 * protocol's last array in the mapped region; and their staged copies, the device region's
 * first past its state (pto_initial). */
pto_u64 *pto_persistent_records(const pto_sched *s) { return s->record; }

pto_u64 *pto_persistent_staged(const pto_sched *s) { return s->staged; }

void pto_persistent_initial(pto_sched *s) { pto_initial(s); }

/* Publish task `ticket` with its producers' tickets: 0, or 1 (pto_host_submit). The caller has
 * waited for the slot and for room in the ring of words, so its waits return at once. */
int pto_persistent_publish(pto_sched *s, pto_u64 ticket, pto_u64 *next_word, const pto_u64 *producers,
                           pto_u32 count, pto_u32 pieces, pto_u32 own_words) {
    return pto_host_submit(s, ticket, next_word, producers, count, pieces, own_words);
}

void pto_persistent_close(pto_sched *s) { pto_store_release32(s->closed, 1); }

void pto_persistent_stop(pto_sched *s, pto_u32 why) { pto_store_release32(s->host_abort, why); }

pto_u64 pto_persistent_done(const pto_sched *s, pto_u32 slot) { return pto_load_acquire64(&s->done[slot]); }

pto_u64 pto_persistent_shown(const pto_sched *s, pto_u32 which) { return pto_load_acquire64(&s->shown[which]); }

pto_u32 pto_persistent_device_abort(const pto_sched *s) { return pto_load_acquire32(s->device_abort); }

pto_u32 pto_persistent_aborted(const pto_sched *s) { return pto_aborted(s); }
