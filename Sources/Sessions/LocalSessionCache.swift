import NIOCore
import NIOPosix

/// The small cache in front of the store: one dictionary per event loop, touched only on that
/// loop, so the hot path takes no lock and makes no store call. An entry lives at most `ttl`
/// (`store.local_cache_ttl`, the bound on staleness when an invalidation is missed).
/// Invalidations run on every loop (at once on the caller's own).
public final class LocalSessionCache<Value>: Sendable {
    @usableFromInline
    final class Storage {
        @usableFromInline var entries: [SessionHandle: Entry] = [:]
        @usableFromInline let capacity: Int
        init(capacity: Int) { self.capacity = capacity }
    }

    @usableFromInline
    struct Entry {
        @usableFromInline var value: Value
        @usableFromInline var sub: String
        @usableFromInline var expires: NIODeadline
        @inlinable init(value: Value, sub: String, expires: NIODeadline) {
            self.value = value
            self.sub = sub
            self.expires = expires
        }
    }

    // The hot-path methods are inlinable so that the caller's module specializes them for its
    // `Value` (an unspecialized generic dictionary costs a metadata lookup per access).
    @usableFromInline let loops: [ObjectIdentifier: NIOLoopBoundBox<Storage>]
    public let ttl: TimeAmount

    /// - Parameters:
    ///   - ttl: zero disables the cache (every lookup misses).
    ///   - capacity: entries per event loop; beyond it expired entries are dropped, then all.
    public init(group: MultiThreadedEventLoopGroup, ttl: TimeAmount, capacity: Int = 100_000) {
        var loops: [ObjectIdentifier: NIOLoopBoundBox<Storage>] = [:]
        for loop in group.makeIterator() {
            loops[ObjectIdentifier(loop)] = .makeBoxSendingValue(Storage(capacity: capacity), eventLoop: loop)
        }
        self.loops = loops
        self.ttl = ttl
    }

    /// The cached value, if fresh. Call on `loop`.
    @inlinable
    public func get(_ handle: SessionHandle, on loop: any EventLoop) -> Value? {
        guard let box = loops[ObjectIdentifier(loop)] else { return nil }
        let storage = box.value
        guard let entry = storage.entries[handle] else { return nil }
        if entry.expires <= .now() {
            storage.entries[handle] = nil
            return nil
        }
        return entry.value
    }

    /// Caches a value for `ttl`. Call on `loop`.
    @inlinable
    public func put(_ handle: SessionHandle, sub: String, _ value: Value, on loop: any EventLoop) {
        guard ttl > .zero, let box = loops[ObjectIdentifier(loop)] else { return }
        let storage = box.value
        let now = NIODeadline.now()
        if storage.entries.count >= storage.capacity {
            storage.entries = storage.entries.filter { $0.value.expires > now }
            if storage.entries.count >= storage.capacity { storage.entries.removeAll(keepingCapacity: true) }
        }
        storage.entries[handle] = Entry(value: value, sub: sub, expires: now + ttl)
    }

    /// Replaces a cached value in place, keeping its expiry. Call on `loop`.
    @inlinable
    public func update(_ handle: SessionHandle, on loop: any EventLoop, _ body: (inout Value) -> Void) {
        guard let box = loops[ObjectIdentifier(loop)] else { return }
        if var entry = box.value.entries[handle] {
            body(&entry.value)
            box.value.entries[handle] = entry
        }
    }

    /// Drops one session on every loop.
    public func invalidate(_ handle: SessionHandle) {
        onEveryLoop { $0.entries[handle] = nil }
    }

    /// Drops every session of a user on every loop.
    public func invalidate(sub: String) {
        onEveryLoop { storage in storage.entries = storage.entries.filter { $0.value.sub != sub } }
    }

    /// Drops everything (a pub/sub reconnect: invalidations may have been missed).
    public func flush() {
        onEveryLoop { $0.entries.removeAll() }
    }

    private func onEveryLoop(_ body: @escaping @Sendable (Storage) -> Void) {
        for (_, box) in loops {
            if box.eventLoop.inEventLoop { body(box.value) } else { box.eventLoop.execute { body(box.value) } }
        }
    }
}
