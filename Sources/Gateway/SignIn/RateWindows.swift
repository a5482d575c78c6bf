/// Events per key in fixed windows: pure; the process keeps one behind a lock for each limit
/// family (`AuthCore.exchanges`, `AuthCore.anonymousWrites`). Per instance, in memory: the
/// limits bound what one process does, and cost no store call.
///
/// The table holds at most `capacity` keys: a key that is new when the table is full is
/// refused until a window ends (windows that ended are swept, at most once a second, so a full
/// table never costs a scan per event).
struct RateWindows: Sendable {
    static let minute: Int64 = 60_000

    struct Window: Sendable, Equatable {
        var start: Int64
        var end: Int64
        var count: Int
    }

    /// Keys held at most.
    let capacity: Int
    private(set) var windows: [String: Window] = [:]
    /// When windows that ended were last swept, and the earliest end among those kept.
    private var sweptAt: Int64? = nil
    private var nextEnd: Int64 = .max

    init(capacity: Int = 100_000) {
        self.capacity = capacity
    }

    /// Counts one event for `key` at `t`: nil when it is within `limit` per `window`
    /// (milliseconds), else the seconds until the event may be admitted (it is not counted).
    /// `limit` 0: no limit, and nothing kept.
    mutating func admit(_ key: String, now t: Int64, limit: Int, window: Int64 = minute) -> Int? {
        if let wait = refusal(key, now: t, limit: limit) { return wait }
        guard limit > 0 else { return nil }
        if let w = windows[key], Self.isOpen(w, at: t) {
            windows[key]?.count = w.count + 1
        } else {
            windows[key] = Window(start: t, end: t + window, count: 1)
            nextEnd = min(nextEnd, t + window)
        }
        return nil
    }

    /// What `admit` would answer, without counting: nil, or the seconds to wait.
    mutating func refusal(_ key: String, now t: Int64, limit: Int) -> Int? {
        guard limit > 0 else { return nil }
        if let w = windows[key], Self.isOpen(w, at: t) {
            return w.count < limit ? nil : Self.seconds(w.end - t)
        }
        guard windows[key] == nil, windows.count >= capacity else { return nil }
        if sweptAt.map({ t - $0 >= 1000 || t < $0 }) ?? true { sweep(t) }
        return windows.count >= capacity ? Self.seconds(nextEnd - t) : nil
    }

    private mutating func sweep(_ t: Int64) {
        windows = windows.filter { Self.isOpen($0.value, at: t) }
        sweptAt = t
        nextEnd = windows.values.map(\.end).min() ?? .max
    }

    /// A window is open from its start until its end; a clock that went back starts a new one.
    private static func isOpen(_ w: Window, at t: Int64) -> Bool { t >= w.start && t < w.end }

    /// Whole seconds, rounded up, at least 1.
    static func seconds(_ milliseconds: Int64) -> Int { Int(max(1, (min(milliseconds, 86_400_000) + 999) / 1000)) }
}
