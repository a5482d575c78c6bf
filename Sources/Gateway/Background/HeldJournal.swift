import Foundation

/// The held revocations on disk (`store.state_dir`/`held-revocations.jsonl`, mode 0600): one
/// JSON record per change — an entry held, an entry done — each written and fsynced before the
/// caller goes on; rewritten with only what is held (a new file renamed over the old) at start
/// and once it has grown to twice that; read back at start. Each record starts with a newline:
/// one cut short (a crash, a full disk) is a line of its own that does not decode, and the next
/// record is whole. `held-revocations.lock` is locked (`flock`) for the life of the process:
/// two gateways never share a directory.
final class HeldJournal: @unchecked Sendable {
    enum Line: Codable, Equatable {
        case hold(HeldRevocation)
        case done(Int64)
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    static let fileName = "held-revocations.jsonl"
    let directory: String
    let path: String
    /// Serialises the writes: a compaction never drops a record being written.
    private let lock = NSLock()
    /// The journal, appended to (-1 once closed).
    private var fd: Int32 = -1
    /// The lock file's descriptor: holds the `flock`.
    private var lockFD: Int32
    /// Records in the file: a compaction is due at twice what is held.
    private var records = 0
    private let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.withoutEscapingSlashes]
        return encoder
    }()

    /// Opens (creating) the journal in `directory` and locks it.
    init(directory: String) throws {
        self.directory = directory
        path = (directory as NSString).appendingPathComponent(Self.fileName)
        try Self.check(directory)
        let lockPath = (directory as NSString).appendingPathComponent("held-revocations.lock")
        lockFD = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lockFD >= 0 else { throw Failure(description: "cannot open \(lockPath): \(String(cString: strerror(errno)))") }
        guard flock(lockFD, LOCK_EX | LOCK_NB) == 0 else {
            Foundation.close(lockFD)
            throw Failure(description: "\(directory) is in use by another sessiongate process (each instance needs its own)")
        }
        fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            Foundation.close(lockFD)
            throw Failure(description: "cannot open \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// That `directory` is one the gateway's user can write to (`check` runs this: it opens nothing).
    static func check(_ directory: String) throws {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw Failure(description: "\(directory) is not a directory (create it, writable by the gateway's user)")
        }
        guard access(directory, W_OK | X_OK) == 0 else {
            throw Failure(description: "\(directory) is not writable by the gateway's user (uid \(getuid()))")
        }
    }

    /// The directory from the configuration, else systemd's (`StateDirectory=` sets
    /// `$STATE_DIRECTORY`; the first of a list).
    static func directory(configured: String?, environment: [String: String] = ProcessInfo.processInfo.environment) -> String? {
        configured ?? environment["STATE_DIRECTORY"]?.split(separator: ":").first.map(String.init)
    }

    deinit { close() }

    /// Closes the files, releasing the lock (at shutdown: the next process may take it).
    func close() {
        lock.withLock {
            if fd >= 0 { Foundation.close(fd) }
            if lockFD >= 0 { Foundation.close(lockFD) }
            fd = -1
            lockFD = -1
        }
    }

    /// What is still held: every entry without its `done`, in the order held (an entry held
    /// twice, once). Records that do not decode are skipped. The file is rewritten with only
    /// what is held.
    func load() throws -> [HeldRevocation] {
        try lock.withLock {
            let data = try Data(contentsOf: URL(fileURLWithPath: path))
            var held: [HeldRevocation] = []
            var seen: Set<Int64> = []
            var done: Set<Int64> = []
            let decoder = JSONDecoder()
            for line in data.split(separator: UInt8(ascii: "\n")) where !line.isEmpty {
                switch try? decoder.decode(Line.self, from: Data(line)) {
                case .hold(let entry): if seen.insert(entry.id).inserted { held.append(entry) }
                case .done(let id): done.insert(id)
                case nil: continue
                }
            }
            let kept = held.filter { !done.contains($0.id) }
            try rewrite(kept)
            return kept
        }
    }

    func append(_ line: Line) throws {
        try lock.withLock {
            guard fd >= 0 else { throw Failure(description: "\(path) is closed (the gateway is stopping)") }
            try Self.write(fd, try record(line), path: path)
            guard fsync(fd) == 0 else { throw Failure(description: "fsync \(path): \(String(cString: strerror(errno)))") }
            records += 1
        }
    }

    /// Rewrites the file with what `live` says is held (read under the journal's lock, so that
    /// no record being written is lost), when it has grown to twice that or nothing is held.
    func compact(_ live: () -> [HeldRevocation]) throws {
        try lock.withLock {
            guard fd >= 0 else { return }
            let entries = live()
            guard entries.isEmpty ? records > 0 : records > 2 * entries.count + 64 else { return }
            try rewrite(entries)
        }
    }

    private func record(_ line: Line) throws -> [UInt8] {
        [UInt8(ascii: "\n")] + Array(try encoder.encode(line))
    }

    /// A new file with `entries`, fsynced, renamed over the journal (the directory fsynced too),
    /// then appended to through the same descriptor. A crash at any point leaves the old file
    /// or the new one, whole; a failure before the rename leaves the old one in use.
    private func rewrite(_ entries: [HeldRevocation]) throws {
        let temporary = path + ".tmp"
        let out = open(temporary, O_RDWR | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard out >= 0 else { throw Failure(description: "cannot open \(temporary): \(String(cString: strerror(errno)))") }
        do {
            var bytes: [UInt8] = []
            for entry in entries { bytes += try record(.hold(entry)) }
            try Self.write(out, bytes, path: temporary)
            guard fsync(out) == 0 else { throw Failure(description: "fsync \(temporary): \(String(cString: strerror(errno)))") }
            guard rename(temporary, path) == 0 else { throw Failure(description: "renaming \(temporary): \(String(cString: strerror(errno)))") }
        } catch {
            Foundation.close(out)
            throw error
        }
        // The descriptor is the journal now: nothing can fail between the rename and the swap.
        if fd >= 0 { Foundation.close(fd) }
        fd = out
        records = entries.count
        let dir = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dir >= 0 else { throw Failure(description: "cannot open \(directory) to fsync the rename: \(String(cString: strerror(errno)))") }
        defer { Foundation.close(dir) }
        guard fsync(dir) == 0 else { throw Failure(description: "fsync \(directory): \(String(cString: strerror(errno)))") }
    }

    private static func write(_ fd: Int32, _ bytes: [UInt8], path: String) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Foundation.write(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw Failure(description: "writing \(path): \(String(cString: strerror(errno)))") }
            offset += n
        }
    }
}
