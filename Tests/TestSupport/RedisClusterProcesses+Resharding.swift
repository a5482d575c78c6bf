import Foundation

extension RedisClusterProcesses {
    /// Moves `slots` from the master on `source` to the master on `target` by hand, one slot at
    /// a time, as `redis-cli --cluster reshard` does: `SETSLOT … IMPORTING` on the target,
    /// `SETSLOT … MIGRATING` on the source, `MIGRATE … KEYS` of the slot's keys (100 at a time)
    /// until the source has none left, then `SETSLOT … NODE target` on the target, the source
    /// and every other master. Returns once every running node reports the target for every
    /// moved slot and the cluster is agreed.
    ///
    /// Safe while clients write (the reason for the order): during the move the source serves
    /// the keys it still has and answers `ASK` for the others, which the target accepts after
    /// `ASKING` only; a key written to the source meanwhile is found by the next
    /// `GETKEYSINSLOT`; once the target owns the slot the source answers `MOVED`. Keys are
    /// read as UTF-8 text: a test must use text keys.
    public func reshard(slots: ClosedRange<Int>, from source: Int, to target: Int, within limit: Duration = .seconds(20)) async throws {
        try await blocking { try self.move(slots, from: source, to: target) }
        try await Poll.within(limit, "every node names \(target) for slots \(slots)") {
            self.seedPorts.allSatisfy { port in
                guard let ranges = self.slotRanges(reportedBy: port) else { return false }
                return slots.allSatisfy { slot in ranges.first { $0.slots.contains(slot) }?.master == target }
            } && self.isAgreed()
        }
    }

    /// Moves the `count` lowest slots the master on `source` serves to the master on `target`
    /// (`reshard(slots:from:to:)` for each run of them); the ranges moved.
    @discardableResult
    public func reshard(count: Int, from source: Int, to target: Int, within limit: Duration = .seconds(30)) async throws -> [ClosedRange<Int>] {
        let owned = slotRanges().filter { $0.master == source }.flatMap { Array($0.slots) }.sorted()
        guard owned.count >= count else { throw Failure(description: "\(source) serves \(owned.count) slots, not \(count)") }
        var runs: [ClosedRange<Int>] = []
        for slot in owned.prefix(count) {
            if let last = runs.last, last.upperBound + 1 == slot {
                runs[runs.count - 1] = last.lowerBound...slot
            } else {
                runs.append(slot...slot)
            }
        }
        for run in runs { try await reshard(slots: run, from: source, to: target, within: limit) }
        return runs
    }

    private func move(_ slots: ClosedRange<Int>, from source: Int, to target: Int) throws {
        let ranges = slotRanges()
        guard slots.allSatisfy({ slot in ranges.first { $0.slots.contains(slot) }?.master == source }) else {
            throw Failure(description: "\(source) does not serve every slot of \(slots): \(ranges)")
        }
        let sourceID = try nodeID(port: source)
        let targetID = try nodeID(port: target)
        // MIGRATE waits up to 5 s for the target: each reply may take longer than the default 2 s.
        let sourceNode = try RedisCommand.Connection(port: source, password: password, timeout: 10)
        let targetNode = try RedisCommand.Connection(port: target, password: password, timeout: 10)
        let otherMasters = try masterPorts().filter { $0 != source && $0 != target }.map {
            try RedisCommand.Connection(port: $0, password: password, timeout: 10)
        }
        for slot in slots.map(String.init) {
            try expectOK(targetNode, ["CLUSTER", "SETSLOT", slot, "IMPORTING", sourceID])
            try expectOK(sourceNode, ["CLUSTER", "SETSLOT", slot, "MIGRATING", targetID])
            while true {
                guard case .array(let keys) = try sourceNode.send(["CLUSTER", "GETKEYSINSLOT", slot, "100"]) else {
                    throw Failure(description: "no key list for slot \(slot) from \(source)")
                }
                if keys.isEmpty { break }
                // REPLACE: a MIGRATE retried after a timeout may find its key already moved.
                var migrate = ["MIGRATE", "127.0.0.1", String(target), "", "0", "5000", "REPLACE"]
                if let password { migrate += ["AUTH", password] }
                let reply = try sourceNode.send(migrate + ["KEYS"] + keys.compactMap(\.string))
                guard reply == .string("OK") || reply == .string("NOKEY") else {
                    throw Failure(description: "MIGRATE of slot \(slot) from \(source) to \(target): \(reply)")
                }
            }
            // The target first: it then owns the slot before the source starts answering MOVED.
            for node in [targetNode, sourceNode] + otherMasters {
                try expectOK(node, ["CLUSTER", "SETSLOT", slot, "NODE", targetID])
            }
        }
    }

    private func expectOK(_ node: RedisCommand.Connection, _ command: [String]) throws {
        let reply = try node.send(command)
        guard reply == .string("OK") else { throw Failure(description: "\(command.joined(separator: " ")) on \(node.port): \(reply)") }
    }
}
