/** Something scheduled: when it is due, and where it sits in the heap (-1: not scheduled). */
export interface Scheduled {
  dueAt: number;
  heapIndex: number;
}

/**
 * A binary min-heap of scheduled items by `dueAt`, each item in it at most once and removable in
 * O(log n): the watchdog's one schedule for all held locks. An item leaves the heap when it is
 * popped or removed, so the heap holds exactly the locks that have something due.
 */
export class DueHeap<T extends Scheduled> {
  private readonly items: T[] = [];

  get size(): number {
    return this.items.length;
  }

  peek(): T | undefined {
    return this.items[0];
  }

  /** Add `item` due at `dueAt`, or move it there if it is already in. */
  schedule(item: T, dueAt: number): void {
    if (item.heapIndex !== -1) this.remove(item);
    item.dueAt = dueAt;
    item.heapIndex = this.items.length;
    this.items.push(item);
    this.up(item.heapIndex);
  }

  pop(): T | undefined {
    const first = this.items[0];
    if (first) this.remove(first);
    return first;
  }

  remove(item: T): void {
    const index = item.heapIndex;
    if (index === -1 || this.items[index] !== item) return;
    const last = this.items.pop() as T;
    item.heapIndex = -1;
    if (last === item) return;
    this.items[index] = last;
    last.heapIndex = index;
    this.down(index);
    this.up(last.heapIndex);
  }

  private up(index: number): void {
    const items = this.items;
    while (index > 0) {
      const parent = (index - 1) >> 1;
      if (items[parent].dueAt <= items[index].dueAt) return;
      this.swap(index, parent);
      index = parent;
    }
  }

  private down(index: number): void {
    const items = this.items;
    for (;;) {
      const left = 2 * index + 1;
      const right = left + 1;
      let smallest = index;
      if (left < items.length && items[left].dueAt < items[smallest].dueAt) smallest = left;
      if (right < items.length && items[right].dueAt < items[smallest].dueAt) smallest = right;
      if (smallest === index) return;
      this.swap(index, smallest);
      index = smallest;
    }
  }

  private swap(a: number, b: number): void {
    const items = this.items;
    const item = items[a];
    items[a] = items[b];
    items[b] = item;
    items[a].heapIndex = a;
    items[b].heapIndex = b;
  }
}
