#!/usr/bin/python3
"""word2vec: tapegrad's examples/word2vec against gensim 4 on the same sentences.

Both train skip-gram with negative sampling with gensim's defaults (vector_size
100, window 5, min_count 5, sample 1e-3, negative 5, alpha 0.025 -> 1e-4,
5 epochs) on the sentences our example exports with --dump-sentences (Brown
corpus by default: tags stripped, case kept), at 1 and 2 threads. Reported:
words/s over raw words x epochs (training only, vocabulary building excluded)
(also per CPU second, which a loaded machine distorts less than wall time)
and the WordSim-353 Spearman, computed for both by gensim's
evaluate_word_pairs (our vectors loaded with load_word2vec_format) and, for
ours, also by our own evaluation.

  apt-get install -y python3-gensim
  /usr/bin/python3 bench/compare_word2vec.py --wordsim WORDSIM353.tsv   # table of both
  /usr/bin/python3 bench/compare_word2vec.py --one gensim --threads 2 --corpus S.txt   # one run, one JSON line

The `--one` mode is what bench/compare.py calls, one fresh process per run so
that each run's peak RSS is its own. Ours is the peak the example reports
(its VmHWM): the child's ru_maxrss would include this script's own peak, which
Linux carries across fork + exec; for the same reason the tapegrad side never
loads the sentences or gensim before the example has run. --wordsim is
optional there (WordSim-353 is not packaged in Debian or npm; pass your copy,
tab-separated word1 word2 score).
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time

from peak_rss import peak_rss_mib

DEFAULTS = dict(vector_size=100, window=5, min_count=5, sample=1e-3, negative=5, alpha=0.025, min_alpha=1e-4,
                epochs=5)


def spearman(wv, wordsim):
    return wv.evaluate_word_pairs(wordsim)[1].correlation if wordsim else float('nan')


def gensim_run(sentences, raw_words, workers, seed, wordsim):
    from gensim.models import Word2Vec
    model = Word2Vec(sg=1, hs=0, workers=workers, seed=seed, **DEFAULTS)
    model.build_vocab(sentences)
    cpu0, t0 = time.process_time(), time.perf_counter()
    model.train(sentences, total_examples=len(sentences), epochs=model.epochs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return dict(wps=raw_words * model.epochs / wall, wall=wall, cpu=cpu, spearman=spearman(model.wv, wordsim),
                peak_rss_mb=peak_rss_mib())


def ours_run(exe, corpus, workers, seed, wordsim, out):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = subprocess.run([exe, '--data', corpus, '--threads', str(workers), '--seed', str(seed), '--out', out,
                           '--neighbours', 'man'] + (['--similarity', wordsim] if wordsim else []),
                          check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r'trained \d+ epochs in ([\d.]+) s: (\d+) words/s', text)
    own = re.search(r'Spearman ([-\d.]+)', text)
    peak = re.search(r'peak RSS ([\d.]+) MiB', text)
    from gensim.models import KeyedVectors
    rho = spearman(KeyedVectors.load_word2vec_format(out, binary=False), wordsim)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if not m or not peak:
        raise SystemExit(f'{exe} printed no "trained ... words/s" or "peak RSS" line:\n{text}')
    return dict(wps=float(m.group(2)), wall=float(m.group(1)), cpu=cpu, spearman=rho,
                own_spearman=float(own.group(1)) if own else float('nan'), peak_rss_mb=float(peak.group(1)))


def read_sentences(path):
    with open(path) as f:
        sentences = [line.split() for line in f if line.strip()]
    return sentences, sum(map(len, sentences))


def count_words(path):
    with open(path) as f:
        return sum(len(line.split()) for line in f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--exe', default='build/examples/word2vec')
    ap.add_argument('--wordsim', help='WordSim-353 file for the Spearman column (required without --one)')
    ap.add_argument('--data', help='text file (default: the Brown corpus as our example reads it)')
    ap.add_argument('--threads', type=int, nargs='+', default=[1, 2])
    ap.add_argument('--seeds', type=int, nargs='+', default=[1])
    ap.add_argument('--one', choices=['gensim', 'tapegrad'], help='run one side once and print one JSON line')
    ap.add_argument('--corpus', help='with --one: the sentences file (written by word2vec --dump-sentences)')
    args = ap.parse_args()
    if args.one:
        threads, seed = args.threads[0], args.seeds[0]
        if args.one == 'gensim':
            sentences, raw_words = read_sentences(args.corpus)
            r = gensim_run(sentences, raw_words, threads, seed, args.wordsim)
        else:
            raw_words = count_words(args.corpus)
            r = ours_run(args.exe, args.corpus, threads, seed, args.wordsim,
                         os.path.join(tempfile.mkdtemp(prefix='w2v_bench_'), 'vectors.txt'))
        print(json.dumps(dict(r, side=args.one, threads=threads, words=raw_words)))
        return
    if not args.wordsim:
        ap.error('--wordsim is required for the table')

    tmp = tempfile.mkdtemp(prefix='w2v_bench_')
    corpus = os.path.join(tmp, 'sentences.txt')
    dump = [args.exe, '--dump-sentences', corpus] + (['--data', args.data] if args.data else [])
    subprocess.run(dump, check=True, capture_output=True)
    sentences, raw_words = read_sentences(corpus)
    print(f'{len(sentences)} sentences, {raw_words} words; {os.cpu_count()} CPUs')
    print(f'{"impl":8} {"threads":>7} {"seed":>4} {"words/s":>10} {"wall s":>7} {"cpu s":>6} {"words/cpu-s":>11} '
          f'{"Spearman":>8}')
    results = {}
    for threads in args.threads:
        for seed in args.seeds:
            for impl in ('gensim', 'tapegrad'):
                r = (gensim_run(sentences, raw_words, threads, seed, args.wordsim) if impl == 'gensim' else
                     ours_run(args.exe, corpus, threads, seed, args.wordsim, os.path.join(tmp, 'vectors.txt')))
                results.setdefault((impl, threads), []).append(r)
                extra = f'  (own eval {r["own_spearman"]:.4f})' if 'own_spearman' in r else ''
                print(f'{impl:8} {threads:>7} {seed:>4} {r["wps"]:>10.0f} {r["wall"]:>7.2f} {r["cpu"]:>6.2f} '
                      f'{raw_words * DEFAULTS["epochs"] / r["cpu"]:>11.0f} {r["spearman"]:>8.4f}{extra}', flush=True)
    print('\nmeans:')
    for threads in args.threads:
        g, t = results[('gensim', threads)], results[('tapegrad', threads)]
        gw, tw = statistics.mean(r['wps'] for r in g), statistics.mean(r['wps'] for r in t)
        gs, ts = statistics.mean(r['spearman'] for r in g), statistics.mean(r['spearman'] for r in t)
        gc, tc = statistics.mean(r['cpu'] for r in g), statistics.mean(r['cpu'] for r in t)
        print(f'threads {threads}: words/s gensim {gw:.0f}, tapegrad {tw:.0f} ({tw / gw:.2f}x); '
              f'CPU seconds gensim {gc:.1f}, tapegrad {tc:.1f} ({gc / tc:.2f}x); '
              f'Spearman gensim {gs:.4f}, tapegrad {ts:.4f} (diff {ts - gs:+.4f})')


if __name__ == '__main__':
    main()
