package dev.taskpush;

/** A task's priority; on the wire low, normal and high are 0, 1 and 2. */
public enum Priority {
    LOW, NORMAL, HIGH;

    int wire() { return ordinal(); }

    private static final Priority[] BY_WIRE = values();

    static Priority fromWire(int v) { return BY_WIRE[v]; }
}
