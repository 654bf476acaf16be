set terminal pngcairo size 1000,650 font ',11'
set grid
set key outside right top
set datafile separator '\t'
set output 'docs/scale/small_xeon_earlier/plots/scaling.png'
set title 'Weak scaling: step time against ranks (median, IQR bars)'
set xlabel 'ranks (np)'
set ylabel 'step time (ms)'
set logscale x 2
set logscale y
plot 'docs/scale/small_xeon_earlier/plots/series0.tsv' using 1:2:3:4 with yerrorlines title 'train, dp=np, ep 1', 'docs/scale/small_xeon_earlier/plots/series1.tsv' using 1:2:3:4 with yerrorlines title 'train, dp=np, ep 2', 'docs/scale/small_xeon_earlier/plots/series2.tsv' using 1:2:3:4 with yerrorlines title 'train, tp=np, ep 1', 'docs/scale/small_xeon_earlier/plots/series3.tsv' using 1:2:3:4 with yerrorlines title 'train, tp=np, ep 2', 'docs/scale/small_xeon_earlier/plots/series4.tsv' using 1:2:3:4 with yerrorlines title 'train, tp 2, dp=np/2, ep 1', 'docs/scale/small_xeon_earlier/plots/series5.tsv' using 1:2:3:4 with yerrorlines title 'train, tp 2, dp=np/2, ep 2', 'docs/scale/small_xeon_earlier/plots/series6.tsv' using 1:2:3:4 with yerrorlines title 'decode, dp=np, ep 1', 'docs/scale/small_xeon_earlier/plots/series7.tsv' using 1:2:3:4 with yerrorlines title 'decode, dp=np, ep 2', 'docs/scale/small_xeon_earlier/plots/series8.tsv' using 1:2:3:4 with yerrorlines title 'decode, tp=np, ep 1', 'docs/scale/small_xeon_earlier/plots/series9.tsv' using 1:2:3:4 with yerrorlines title 'decode, tp=np, ep 2', 'docs/scale/small_xeon_earlier/plots/series10.tsv' using 1:2:3:4 with yerrorlines title 'decode, tp 2, dp=np/2, ep 1', 'docs/scale/small_xeon_earlier/plots/series11.tsv' using 1:2:3:4 with yerrorlines title 'decode, tp 2, dp=np/2, ep 2', 'docs/scale/small_xeon_earlier/plots/ideal.tsv' using 1:($2/1) with lines dashtype 2 lw 2 title 'ideal (train)', 'docs/scale/small_xeon_earlier/plots/ideal.tsv' using 1:($4/1) with lines dashtype 2 lw 2 title 'ideal (decode)', 
set output 'docs/scale/small_xeon_earlier/plots/efficiency.png'
set title 'Parallel efficiency: ideal step time / measured'
set ylabel 'efficiency (1 = ideal)'
unset logscale y
set yrange [0:*]
plot 'docs/scale/small_xeon_earlier/plots/series0.tsv' using 1:5 with linespoints title 'train, dp=np, ep 1', 'docs/scale/small_xeon_earlier/plots/series1.tsv' using 1:5 with linespoints title 'train, dp=np, ep 2', 'docs/scale/small_xeon_earlier/plots/series2.tsv' using 1:5 with linespoints title 'train, tp=np, ep 1', 'docs/scale/small_xeon_earlier/plots/series3.tsv' using 1:5 with linespoints title 'train, tp=np, ep 2', 'docs/scale/small_xeon_earlier/plots/series4.tsv' using 1:5 with linespoints title 'train, tp 2, dp=np/2, ep 1', 'docs/scale/small_xeon_earlier/plots/series5.tsv' using 1:5 with linespoints title 'train, tp 2, dp=np/2, ep 2', 'docs/scale/small_xeon_earlier/plots/series6.tsv' using 1:5 with linespoints title 'decode, dp=np, ep 1', 'docs/scale/small_xeon_earlier/plots/series7.tsv' using 1:5 with linespoints title 'decode, dp=np, ep 2', 'docs/scale/small_xeon_earlier/plots/series8.tsv' using 1:5 with linespoints title 'decode, tp=np, ep 1', 'docs/scale/small_xeon_earlier/plots/series9.tsv' using 1:5 with linespoints title 'decode, tp=np, ep 2', 'docs/scale/small_xeon_earlier/plots/series10.tsv' using 1:5 with linespoints title 'decode, tp 2, dp=np/2, ep 1', 'docs/scale/small_xeon_earlier/plots/series11.tsv' using 1:5 with linespoints title 'decode, tp 2, dp=np/2, ep 2', 1 with lines dashtype 2 lw 2 title 'ideal'
set output 'docs/scale/small_xeon_earlier/plots/breakdown.png'
set key inside left top
set title 'Where a step goes (rank 0, medians)'
unset logscale x
set xlabel ''
set ylabel 'time per step (ms)'
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set xtics rotate by -40
set yrange [0:*]
plot 'docs/scale/small_xeon_earlier/plots/breakdown.tsv' using 2:xtic(1) title 'compute (forward+backward; inference: whole step)', '' using 3 title 'gradient sync + FSDP exposed', '' using 4 title 'optimizer', '' using 5 title 'rest of the step'
set output 'docs/scale/small_xeon_earlier/plots/predicted.png'
set title 'Step-time model: predicted against measured (IQR bars)'
set style data points
set xtics norotate
set xlabel 'measured step time (ms)'
set ylabel 'predicted step time (ms)'
set logscale xy
set yrange [*:*]
set xrange [*:*]
plot 'docs/scale/small_xeon_earlier/plots/predicted.tsv' using ($5==0?$1:1/0):2:3:4 with xerrorbars pt 7 title 'held out', '' using ($5==1?$1:1/0):2 with points pt 5 ps 1.5 title 'calibration (np 1; tp = np, ep 1)', x with lines dashtype 2 title 'predicted = measured', 1.3*x with lines dashtype 3 lc 'gray' title '+/-30%', 0.7*x with lines dashtype 3 lc 'gray' notitle
